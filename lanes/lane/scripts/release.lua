-- release.lua: a holder gives its slot back; the slot goes to the head waiter.
-- KEYS: the seven lane keys (see lib.lua).
-- ARGV[1] id        holder id
-- ARGV[2] epoch     generation the holder was given ...
-- ARGV[3] counter   ... both must match, or nothing changes (fencing)
-- ARGV[4] lease_ms  lease for the holder the slot is handed to
-- Returns {released (1/0), more (1/0)}: more = slots and waiters remain
-- beyond this call's bounded handoff.
local id, lease_ms = ARGV[1], tonumber(ARGV[4])
local now = now_ms()
local st = load_state(now, '', lease_ms)
if not st then return {0, 0} end   -- state lost: nothing of ours is recorded
local info = redis.call('HGET', K_HINFO, id)
local released = 0
if info then
  local epoch, counter = parse_hinfo(info)
  if epoch == ARGV[2] and counter == ARGV[3] then
    unhold(st, id, now, info)
    released = 1
  end
end
reap_due(st, now)
local more = false
if redis.call('ZCARD', K_QUEUE) > 0 then more = grant_free(st, now, lease_ms) end
return {released, more and 1 or 0}
