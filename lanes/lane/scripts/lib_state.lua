-- lib_state.lua: the lane's state (meta), created when absent.
--! include base

-- The lane's state, recreating it when absent. width_arg '' means the caller
-- does not know the width: the script then answers 'nostate' and the client
-- asks the owner (catalog or constructor) and calls again.
local function load_state(now, width_arg, lease_ms)
  local m = redis.call('HMGET', K_META, 'width', 'epoch', 'quiet_until', 'reap_at',
    'hold_ewma_ms', 'inflight', 'run', 'wf1', 'multi')
  if m[1] and m[7] and RUN ~= '' and m[7] ~= RUN then
    -- Written by another server process: a restart that loaded an older
    -- snapshot (or an AOF missing its last second), or a failover. Its
    -- holders and waiters may be stale (a grant made after the snapshot is
    -- not in it), so none is trusted: a new epoch, past the old one even if
    -- this server's clock is behind, and the quiet period in which live
    -- holders re-register, exactly as after a loss. Width and statistics stay.
    redis.call('DEL', K_HOLDERS, K_HINFO, K_QUEUE, K_WEXP, K_SHARES, K_WFQ)
    -- The holder counts per priority and workflow (meta h:<prio>:<wf>,
    -- lib_hold.lua) and the yield marks (y:<id>, lib_yield.lua) go with
    -- the holders they are about.
    local fields = redis.call('HKEYS', K_META)
    for i = 1, #fields do
      local head = string.sub(fields[i], 1, 2)
      if head == 'h:' or head == 'y:' then redis.call('HDEL', K_META, fields[i]) end
    end
    local epoch = math.max(now, tonumber(m[2]) + 1)
    local quiet = now + lease_ms
    redis.call('HSET', K_META, 'epoch', fmt(epoch), 'counter', 0, 'inflight', 0, 'seq', 0,
      'quiet_until', fmt(quiet), 'reap_at', 0, 'run', RUN)
    redis.call('HINCRBY', K_META, 'restarts', 1)
    return {width = tonumber(m[1]), epoch = epoch, quiet_until = quiet, reap_at = 0,
      ewma = tonumber(m[5]), inflight = 0, wf1 = m[8], multi = m[9]}
  end
  if m[1] then
    if not m[7] and RUN ~= '' then redis.call('HSET', K_META, 'run', RUN) end
    return {width = tonumber(m[1]), epoch = tonumber(m[2]), quiet_until = tonumber(m[3]),
      reap_at = tonumber(m[4]) or 0, ewma = tonumber(m[5]), inflight = tonumber(m[6]) or 0,
      wf1 = m[8], multi = m[9]}
  end
  if width_arg == nil or width_arg == '' then return nil end
  -- No state: a new lane, or Redis lost it (restart without persistence).
  -- Holders of a lost state may still be running: grant nothing for one lease
  -- period so they can re-register by renewal, so the lane never admits more
  -- than W because Redis forgot who held. Leftover keys of a partial loss are
  -- cleared so that every structure belongs to the new epoch.
  redis.call('DEL', K_HOLDERS, K_HINFO, K_QUEUE, K_WEXP, K_SHARES, K_WFQ)
  local quiet = now + lease_ms
  redis.call('HSET', K_META, 'width', width_arg, 'epoch', fmt(now), 'counter', 0, 'inflight', 0,
    'seq', 0, 'quiet_until', fmt(quiet), 'run', RUN)
  return {width = tonumber(width_arg), epoch = now, quiet_until = quiet, reap_at = 0, inflight = 0}
end

-- A score was written to holders or wexp: keep reap_at a lower bound.
local function lower_reap_at(st, score)
  if score < st.reap_at then
    st.reap_at = score
    redis.call('HSET', K_META, 'reap_at', fmt(score))
  end
end

-- holders gained (n > 0) or lost (n < 0) entries.
local function add_inflight(st, n)
  st.inflight = redis.call('HINCRBY', K_META, 'inflight', n)
end
