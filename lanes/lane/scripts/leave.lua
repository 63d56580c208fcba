-- leave.lua: a waiter stops waiting (its budget ran out, or it was cancelled).
-- If a slot was handed to it in the same instant, the slot goes back to the
-- next waiter, so nothing leaks and nobody holds after being told it did not.
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] member    the waiter's member (see lib_base.lua)
-- ARGV[2] reason    'timeouts' or 'cancels' (the counter to bump)
-- ARGV[3] lease_ms  the caller's lease (a returned slot handed on gets the
--                   next waiter's own lease, carried in its queue entry)
-- ARGV[4] run       run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns 'left' (was queued), 'returned' (had been granted; slot passed on)
-- or 'gone' (already removed: its deadline or lease had lapsed, counted then).
--! include reap handoff
local member, reason, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
if reason ~= 'timeouts' and reason ~= 'cancels' then
  return redis.error_reply('leave: reason must be timeouts or cancels, got ' .. reason)
end
local now = now_ms()
local st = load_state(now, '', lease_ms)
if not st then return 'gone' end
local outcome = 'gone'
local _, _, id = parse_waiter(member)
if not id then
  return redis.error_reply('leave: waiter member must be notify:timeout_ms:lease_ms:id[:workflow], got ' .. member)
end
local score = tonumber(redis.call('ZSCORE', K_QUEUE, member))
if score then
  queue_remove(st, member, score)
  outcome = 'left'
elseif redis.call('HEXISTS', K_HINFO, id) == 1 then
  unhold(st, id, now, nil)
  redis.call('HINCRBY', K_META, 'returned', 1)
  outcome = 'returned'
end
if outcome ~= 'gone' then redis.call('HINCRBY', K_META, reason, 1) end
reap(st, now)
grant_free(st, now)
return outcome
