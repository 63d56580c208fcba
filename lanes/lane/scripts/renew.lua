-- renew.lua: one batched renewal of a process's holders and waiters on a lane,
-- plus the reap-and-handoff any call does (so a process with waiters that wakes
-- at the earliest lease expiry reaps crashed holders even when no one else acts).
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] lease_ms  new lease length from now
-- ARGV[2] width     owner's width if the state must be recreated; '' = ask
-- ARGV[3..] entries of 6 fields each:
--   kind     'h' holder or 'w' waiter
--   id       holder: its id; waiter: its member (see lib_base.lua)
--   epoch    holder: epoch of its generation; waiter: epoch it queued in
--   counter  holder: counter of its generation; waiter: 0
--   priority
--   workflow holder: its workflow ('' = anonymous; kept if it re-registers);
--            waiter: '' (its member names it)
-- ARGV[last] run    run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns {epoch, next_event_ms, more, code_1, ..., code_n} (or {'nostate'}):
--   holder: 'ok' renewed | 'rereg' re-registered after a state loss | 'lost'
--   waiter: 'q' still queued (place renewed) | 'g:<epoch>:<counter>' granted
--           (its doorbell may have been lost) | 'x' no longer queued
--! include reap handoff
local lease_ms = tonumber(ARGV[1])
local now = now_ms()
local st = load_state(now, ARGV[2], lease_ms)
if not st then return {'nostate'} end
local n = (#ARGV - 3) / 6   -- the last ARGV is run
local codes = {}
local deadline = now + lease_ms
for i = 0, n - 1 do
  local b = 3 + i * 6
  local kind, id, epoch, counter, prio = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local code
  if kind == 'h' then
    local info = redis.call('HGET', K_HINFO, id)
    if info then
      local e, c = parse_hinfo(info)
      if e == epoch and c == counter and tonumber(redis.call('ZSCORE', K_HOLDERS, id)) > now then
        redis.call('ZADD', K_HOLDERS, deadline, id)
        code = 'ok'
      else
        code = 'lost'
      end
    elseif tonumber(epoch) < st.epoch and now < st.quiet_until and st.inflight < st.width then
      -- A holder from before a state loss, inside the quiet period: take it
      -- back with its old generation (new grants all carry the new, larger
      -- epoch). Capped at the width: the lane never admits more than W.
      if redis.call('ZADD', K_HOLDERS, deadline, id) == 1 then
        add_inflight(st, 1)
        note_holding(prio, ARGV[b + 5], 1)
      end
      redis.call('HSET', K_HINFO, id, hinfo_of(epoch, counter, now, prio, ARGV[b + 5]))
      code = 'rereg'
    else
      code = 'lost'
    end
  else
    local score = tonumber(redis.call('ZSCORE', K_QUEUE, id))
    if score then
      local _, timeout = parse_waiter(id)
      local exp = deadline
      local wait_until = wait_deadline(st, score, timeout)
      if wait_until and wait_until < exp then exp = wait_until end
      if tonumber(redis.call('ZSCORE', K_WEXP, id)) > now then
        redis.call('ZADD', K_WEXP, exp, id)
        code = 'q'
      else
        code = 'x'   -- lapsed already; the reap below removes it
      end
    else
      local _, _, wid = parse_waiter(id)
      local info = wid and redis.call('HGET', K_HINFO, wid)
      if info then
        local e, c = parse_hinfo(info)
        code = 'g:' .. e .. ':' .. c
      else
        code = 'x'
      end
    end
  end
  codes[#codes + 1] = code
end
reap(st, now)
local more = grant_free(st, now)
local out = {fmt(st.epoch), next_event(st, now), more and 1 or 0}
for i = 1, #codes do out[#out + 1] = codes[i] end
return out
