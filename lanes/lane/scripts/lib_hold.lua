-- lib_hold.lua: holder entries (holders, hinfo, the holder count per
-- priority and workflow) and admission-wait samples.
--! include state

-- epoch, counter (strings), granted_ms, priority and workflow ('' when the
-- entry has no workflow part) of a holder's hinfo entry.
local function parse_hinfo(info)
  local epoch, counter, granted, prio, wf = string.match(info, '^(%d+):(%d+):(%d+):(%d+):?(.*)$')
  return epoch, counter, tonumber(granted), tonumber(prio), wf
end

local function hinfo_of(epoch, counter, now, prio, wf)
  local info = epoch .. ':' .. counter .. ':' .. fmt(now) .. ':' .. prio
  if wf ~= '' then info = info .. ':' .. wf end
  return info
end

-- The holder count of (prio, wf), meta h:<prio>:<wf>, moved by n. Kept in
-- meta so that the hot paths fold it into the meta reads and writes they do
-- anyway; a count at 0 stays (readers skip it).
local function note_holding(prio, wf, n)
  redis.call('HINCRBY', K_META, 'h:' .. prio .. ':' .. wf, n)
end

local function record_wait(prio, wait_ms)
  -- Trimmed in batches: one LPUSH per grant, an LTRIM every WAITS_SLACK.
  if wait_ms < 0 then wait_ms = 0 end
  local n = redis.call('LPUSH', K_WAITS, prio .. ':' .. fmt(wait_ms))
  if n > WAITS_KEEP + WAITS_SLACK then redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1) end
end

-- Make id a holder with a fresh generation. Returns counter, lease deadline.
local function grant(st, id, prio, now, lease_ms, wf)
  local counter = redis.call('HINCRBY', K_META, 'counter', 1)
  local deadline = now + lease_ms
  -- inflight follows the entries: it moves only when one is really added.
  if redis.call('ZADD', K_HOLDERS, deadline, id) == 1 then
    add_inflight(st, 1)
    note_holding(prio, wf, 1)
  end
  redis.call('HSET', K_HINFO, id, hinfo_of(fmt(st.epoch), fmt(counter), now, prio, wf))
  lower_reap_at(st, deadline)
  return counter, deadline
end

-- Remove a holder. released: it released normally (its hold time then
-- feeds the EWMA). info: its hinfo entry, if the caller read it.
local function unhold(st, id, now, info, released)
  info = info or redis.call('HGET', K_HINFO, id)
  if redis.call('ZREM', K_HOLDERS, id) == 1 then
    add_inflight(st, -1)
    if info then
      local _, _, _, prio, wf = parse_hinfo(info)
      note_holding(prio, wf, -1)
    end
  end
  redis.call('HDEL', K_HINFO, id)
  redis.call('HDEL', K_META, 'y:' .. id)   -- its yield mark, if any (lib_yield.lua)
  if info and released then
    local _, _, granted = parse_hinfo(info)
    local hold = now - granted
    local ewma = st.ewma
    if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
    st.ewma = ewma
    redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma))
  end
end
