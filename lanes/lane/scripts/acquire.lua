-- acquire.lua: grant at once, or join the queue (or, with try_only, refuse).
-- KEYS: the seven lane keys (see lib_base.lua).
-- ARGV[1] id           waiter/holder id (unique per acquisition)
-- ARGV[2] priority     0 interactive, 1 user tool, 2 background
-- ARGV[3] timeout_ms   wait budget; -1 = no limit (the waiter lease still applies)
-- ARGV[4] lease_ms     holder lease, and waiter lease until the first renewal
-- ARGV[5] width        owner's width if the state must be recreated; '' = ask
-- ARGV[6] channel      the caller process's wake channel
-- ARGV[7] try_only     1 = never queue
-- ARGV[8] notify       1 = drop this waiter if a grant finds nobody listening
-- ARGV[9] fresh        1 = first call with this id (it cannot hold or be queued
--                      yet, so those checks are skipped); absent or 0 = check
-- Returns one of:
--   {'granted', epoch, counter}
--   {'queued', epoch, next_event_ms}   wait for the doorbell on the channel
--   {'busy', epoch}                    try_only and no free slot
--   {'nostate'}                        state absent and width unknown
--! include base
local id, prio, timeout_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[4])
local now = now_ms()

-- Fast path (the common uncontended call): a fresh id, state present, not
-- quiet, nothing due for reaping, nobody queued and a slot free. Inline, with
-- no helper beyond lib_base, so it creates no closure and no table of its own.
if ARGV[9] == '1' then
  local m = redis.call('HMGET', K_META, 'width', 'epoch', 'quiet_until', 'reap_at')
  local reap_at = tonumber(m[4])
  if m[1] and reap_at and now < reap_at and now >= tonumber(m[3])
      and redis.call('ZCARD', K_QUEUE) == 0 and redis.call('ZCARD', K_HOLDERS) < tonumber(m[1]) then
    local counter = redis.call('HINCRBY', K_META, 'counter', 1)
    local deadline = now + lease_ms
    redis.call('ZADD', K_HOLDERS, deadline, id)
    -- now, counter and ARGV[2] are below 10^14: '..' writes them exactly.
    redis.call('HSET', K_HINFO, id, m[2] .. ':' .. counter .. ':' .. now .. ':' .. ARGV[2])
    if deadline < reap_at then redis.call('HSET', K_META, 'reap_at', deadline) end
    if redis.call('LPUSH', K_WAITS, ARGV[2] .. ':0') > WAITS_KEEP + WAITS_SLACK then
      redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1)
    end
    return {'granted', m[2], counter}
  end
end

--! include reap handoff
local st = load_state(now, ARGV[5], lease_ms)
if not st then return {'nostate'} end
reap_due(st, now)
local queued = redis.call('ZCARD', K_QUEUE)
if queued > 0 then
  grant_free(st, now, lease_ms)
  queued = redis.call('ZCARD', K_QUEUE)
end

if ARGV[9] ~= '1' then
  -- A repeated call with the same id (a waiter rejoining after its place
  -- lapsed) must not make a second entry or a second holder.
  local held = redis.call('HGET', K_HINFO, id)
  if held then
    local epoch, counter = parse_hinfo(held)
    return {'granted', epoch, counter}
  end
  if redis.call('ZSCORE', K_QUEUE, id) then
    unqueue(id)
    queued = queued - 1
  end
end

if now >= st.quiet_until and queued == 0 and redis.call('ZCARD', K_HOLDERS) < st.width then
  local counter = grant(st, id, prio, now, lease_ms)
  record_wait(prio, 0)
  return {'granted', fmt(st.epoch), fmt(counter)}
end
if ARGV[7] == '1' then return {'busy', fmt(st.epoch)} end

local seq = redis.call('HINCRBY', K_META, 'seq', 1)
local deadline = -1
local wexp = now + lease_ms
if timeout_ms >= 0 then
  deadline = now + timeout_ms
  if deadline < wexp then wexp = deadline end
end
redis.call('ZADD', K_QUEUE, prio * PRIO_SPAN + seq, id)
redis.call('ZADD', K_WEXP, wexp, id)
lower_reap_at(st, wexp)
redis.call('HSET', K_WINFO, id,
  prio .. ':' .. fmt(now) .. ':' .. fmt(deadline) .. ':' .. ARGV[8] .. ':' .. ARGV[6])
return {'queued', fmt(st.epoch), next_event(st, now)}
