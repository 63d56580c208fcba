-- release.lua: a holder gives its slot back; the slot goes to the head waiter.
-- KEYS: the seven lane keys (see lib_base.lua).
-- ARGV[1] id        holder id
-- ARGV[2] epoch     generation the holder was given ...
-- ARGV[3] counter   ... both must match, or nothing changes (fencing)
-- ARGV[4] lease_ms  lease for the holder the slot is handed to
-- Returns {released (1/0), more (1/0)}: more = slots and waiters remain
-- beyond this call's bounded handoff.
--! include base
local id, lease_ms = ARGV[1], tonumber(ARGV[4])
local now = now_ms()
local m = redis.call('HMGET', K_META, 'epoch', 'reap_at', 'hold_ewma_ms', 'hold_n')
if not m[1] then return {0, 0} end   -- state lost: nothing of ours is recorded
local info = redis.call('HGET', K_HINFO, id)
local released = 0
if info then
  local epoch, counter, granted = string.match(info, '^(%d+):(%d+):(%d+):')
  if epoch == ARGV[2] and counter == ARGV[3] then
    -- Inline unhold (lib_hold.lua) with the hold time fed to the EWMA.
    redis.call('ZREM', K_HOLDERS, id)
    redis.call('HDEL', K_HINFO, id)
    local hold = now - tonumber(granted)
    local ewma = tonumber(m[3])
    if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
    redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'hold_n', (tonumber(m[4]) or 0) + 1)
    released = 1
  end
end
-- Fast path: nothing due for reaping and nobody waiting.
if now < (tonumber(m[2]) or 0) and redis.call('ZCARD', K_QUEUE) == 0 then return {released, 0} end

--! include reap handoff
local st = load_state(now, '', lease_ms)
reap_due(st, now)
local more = false
if redis.call('ZCARD', K_QUEUE) > 0 then more = grant_free(st, now, lease_ms) end
return {released, more and 1 or 0}
