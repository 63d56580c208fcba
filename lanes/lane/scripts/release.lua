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
local m = redis.call('HMGET', K_META, 'epoch', 'reap_at', 'hold_ewma_ms', 'hold_n', 'width', 'quiet_until',
  'counter')
if not m[1] then return {0, 0} end   -- state lost: nothing of ours is recorded
local info = redis.call('HGET', K_HINFO, id)
local released = 0
local ewma, hold_n   -- the hold time fed to the EWMA, written once below
if info then
  local epoch, counter, granted = string.match(info, '^(%d+):(%d+):(%d+):')
  if epoch == ARGV[2] and counter == ARGV[3] then
    -- Inline unhold (lib_hold.lua).
    redis.call('ZREM', K_HOLDERS, id)
    redis.call('HDEL', K_HINFO, id)
    local hold = now - tonumber(granted)
    ewma = tonumber(m[3])
    if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
    hold_n = (tonumber(m[4]) or 0) + 1
    released = 1
  end
end
local reap_at = tonumber(m[2]) or 0
if now < reap_at then
  local head = redis.call('ZRANGE', K_QUEUE, 0, 0)
  -- Fast path: nothing due for reaping and nobody waiting.
  if #head == 0 then
    if ewma then redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'hold_n', hold_n) end
    return {released, 0}
  end
  -- Lean handoff (the hot path under load), inline like the fast path: not
  -- quiet and exactly one slot free, given to the head waiter. Nothing is due
  -- for reaping, so the head's wexp score (>= reap_at > now) has not passed:
  -- the head is live. Same writes as grant_free's step (lib_handoff.lua), with
  -- the counter and the EWMA written in one HSET.
  if now >= (tonumber(m[6]) or 0) and tonumber(m[5]) - redis.call('ZCARD', K_HOLDERS) == 1 then
    local wid = head[1]
    local winfo = redis.call('HGET', K_WINFO, wid)
    local prio, enq, notify, channel
    if winfo then prio, enq, notify, channel = string.match(winfo, '^(%d+):(%d+):%-?%d+:(%d):(.*)$') end
    if prio then
      redis.call('ZREM', K_QUEUE, wid)
      redis.call('ZREM', K_WEXP, wid)
      redis.call('HDEL', K_WINFO, wid)
      local counter = (tonumber(m[7]) or 0) + 1
      if ewma then
        redis.call('HSET', K_META, 'counter', counter, 'hold_ewma_ms', tostring(ewma), 'hold_n', hold_n)
        ewma = nil
      else
        redis.call('HSET', K_META, 'counter', counter)
      end
      local deadline = now + lease_ms
      redis.call('ZADD', K_HOLDERS, deadline, wid)
      -- now, counter, enq are below 10^14: '..' writes them exactly.
      redis.call('HSET', K_HINFO, wid, m[1] .. ':' .. counter .. ':' .. now .. ':' .. prio)
      if deadline < reap_at then redis.call('HSET', K_META, 'reap_at', deadline) end
      local heard = redis.call('PUBLISH', channel, wid .. ' ' .. m[1] .. ' ' .. counter)
      if notify == '1' and heard == 0 then
        -- Nobody listens for this waiter: take the slot back (as grant_free
        -- does) and let the slow path below hand it to the next one.
        redis.call('ZREM', K_HOLDERS, wid)
        redis.call('HDEL', K_HINFO, wid)
        redis.call('HINCRBY', K_META, 'returned', 1)
        redis.call('HINCRBY', K_META, 'lapsed', 1)
      else
        if redis.call('LPUSH', K_WAITS, prio .. ':' .. (now - tonumber(enq))) > WAITS_KEEP + WAITS_SLACK then
          redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1)
        end
        return {released, 0}   -- the one free slot is taken: nothing more
      end
    end
  end
end
if ewma then redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'hold_n', hold_n) end

--! include reap handoff
local st = load_state(now, '', lease_ms)
reap_due(st, now)
local more = false
if redis.call('ZCARD', K_QUEUE) > 0 then more = grant_free(st, now, lease_ms) end
return {released, more and 1 or 0}
