-- lib_hold.lua: holder entries (holders, hinfo) and admission-wait samples.
--! include state

local function parse_hinfo(info)
  local epoch, counter, granted, prio = string.match(info, '^(%d+):(%d+):(%d+):(%d+)$')
  return epoch, counter, tonumber(granted), tonumber(prio)
end

local function record_wait(prio, wait_ms)
  -- Trimmed in batches: one LPUSH per grant, an LTRIM every WAITS_SLACK.
  if wait_ms < 0 then wait_ms = 0 end
  local n = redis.call('LPUSH', K_WAITS, prio .. ':' .. fmt(wait_ms))
  if n > WAITS_KEEP + WAITS_SLACK then redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1) end
end

-- Make id a holder with a fresh generation. Returns counter, lease deadline.
local function grant(st, id, prio, now, lease_ms)
  local counter = redis.call('HINCRBY', K_META, 'counter', 1)
  local deadline = now + lease_ms
  -- inflight follows the entries: it moves only when one is really added.
  if redis.call('ZADD', K_HOLDERS, deadline, id) == 1 then add_inflight(st, 1) end
  redis.call('HSET', K_HINFO, id, fmt(st.epoch) .. ':' .. fmt(counter) .. ':' .. fmt(now) .. ':' .. prio)
  lower_reap_at(st, deadline)
  return counter, deadline
end

-- Remove a holder. info (its hinfo entry) is given when it released normally:
-- its hold time then feeds the EWMA.
local function unhold(st, id, now, info)
  if redis.call('ZREM', K_HOLDERS, id) == 1 then add_inflight(st, -1) end
  redis.call('HDEL', K_HINFO, id)
  if info then
    local _, _, granted = parse_hinfo(info)
    local hold = now - granted
    local ewma = st.ewma
    if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
    st.ewma = ewma
    redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma))
  end
end
