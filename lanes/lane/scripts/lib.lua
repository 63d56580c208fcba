-- lib.lua: helpers shared by every lane script. The loader prepends this file
-- to each script, so a script reads as one unit on the server.
--
-- Every script of a lane takes the same seven KEYS, all sharing one hash tag
-- (one Redis Cluster slot); lanes/lane/keys.py builds them:
--   KEYS[1] meta     hash  width, epoch, counter (last generation), seq (enqueue
--                          counter), quiet_until (ms), reap_at (ms), returned,
--                          timeouts, cancels, expired, lapsed, hold_ewma_ms, hold_n
--   KEYS[2] holders  zset  holder id -> lease deadline (ms, Redis server time)
--   KEYS[3] hinfo    hash  holder id -> "epoch:counter:granted_ms:priority"
--   KEYS[4] queue    zset  waiter id -> priority * 2^44 + seq (class, then arrival)
--   KEYS[5] wexp     zset  waiter id -> min(waiter lease deadline, wait deadline)
--   KEYS[6] winfo    hash  waiter id -> "priority:enqueued_ms:deadline_ms:notify:channel"
--                          (deadline_ms -1 = no wait limit; notify 1 = the grant
--                          must reach a subscriber or the waiter is dropped)
--   KEYS[7] waits    list  recent admission waits "priority:ms", newest first
--
-- Grants counted = counter - returned (a grant taken back, e.g. by a waiter
-- that left in the same instant, bumps 'returned'), so a grant writes one
-- counter. reap_at is a lower bound of every score in holders and wexp (absent
-- = 0): acquire and release skip the reap while now < reap_at; every other
-- script reaps in full and stores the exact bound again.
local K_META, K_HOLDERS, K_HINFO, K_QUEUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_WEXP, K_WINFO, K_WAITS = KEYS[5], KEYS[6], KEYS[7]

local PRIO_SPAN = 17592186044416 -- 2^44; exact in a double up to priority 255
local REAP_MAX = 64               -- expired entries removed per call (bounded work)
local GRANT_MAX = 256             -- grants per call; callers loop on the 'more' flag
local WAITS_KEEP = 512            -- admission-wait samples kept for p50/p95
local WAITS_SLACK = 64            -- the list is trimmed back to WAITS_KEEP past this
local EWMA_ALPHA = 0.1            -- weight of the newest hold time
local NEVER = 9007199254740992    -- 2^53: reap_at when nothing can expire

local function now_ms()
  -- Server time: every lease and wait deadline is on one clock (Redis >= 5
  -- replicates script effects, so TIME is allowed before writes).
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n) return string.format('%d', n) end

-- The lane's state, recreating it when absent. width_arg '' means the caller
-- does not know the width: the script then answers 'nostate' and the client
-- asks the owner (catalog or constructor) and calls again.
local function load_state(now, width_arg, lease_ms)
  local m = redis.call('HMGET', K_META, 'width', 'epoch', 'quiet_until', 'reap_at',
    'hold_ewma_ms', 'hold_n')
  if m[1] then
    return {width = tonumber(m[1]), epoch = tonumber(m[2]), quiet_until = tonumber(m[3]),
      reap_at = tonumber(m[4]) or 0, ewma = tonumber(m[5]), hold_n = tonumber(m[6]) or 0}
  end
  if width_arg == nil or width_arg == '' then return nil end
  -- No state: a new lane, or Redis lost it (restart without persistence).
  -- Holders of a lost state may still be running: grant nothing for one lease
  -- period so they can re-register by renewal, so the lane never admits more
  -- than W because Redis forgot who held. Leftover keys of a partial loss are
  -- cleared so that every structure belongs to the new epoch.
  redis.call('DEL', K_HOLDERS, K_HINFO, K_QUEUE, K_WEXP, K_WINFO)
  local quiet = now + lease_ms
  redis.call('HSET', K_META, 'width', width_arg, 'epoch', fmt(now), 'counter', 0,
    'seq', 0, 'quiet_until', fmt(quiet))
  return {width = tonumber(width_arg), epoch = now, quiet_until = quiet, reap_at = 0, hold_n = 0}
end

-- A score was written to holders or wexp: keep reap_at a lower bound.
local function lower_reap_at(st, score)
  if score < st.reap_at then
    st.reap_at = score
    redis.call('HSET', K_META, 'reap_at', fmt(score))
  end
end

local function parse_winfo(info)
  local prio, enq, deadline, notify, channel =
    string.match(info, '^(%d+):(%d+):(-?%d+):(%d):(.*)$')
  return tonumber(prio), tonumber(enq), tonumber(deadline), notify == '1', channel
end

local function parse_hinfo(info)
  local epoch, counter, granted, prio = string.match(info, '^(%d+):(%d+):(%d+):(%d+)$')
  return epoch, counter, tonumber(granted), tonumber(prio)
end

-- Remove a waiter from every waiter structure; returns its winfo (or false).
local function unqueue(id)
  local info = redis.call('HGET', K_WINFO, id)
  redis.call('ZREM', K_QUEUE, id)
  redis.call('ZREM', K_WEXP, id)
  redis.call('HDEL', K_WINFO, id)
  return info
end

-- A waiter leaves without a grant: count why (its own deadline, or its lease).
local function drop_waiter(id, now)
  local info = unqueue(id)
  if not info then return end
  local _, _, deadline = parse_winfo(info)
  if deadline >= 0 and deadline <= now then
    redis.call('HINCRBY', K_META, 'timeouts', 1)
  else
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  end
end

local function record_wait(prio, wait_ms)
  -- Trimmed in batches: one LPUSH per grant, an LTRIM every WAITS_SLACK.
  local n = redis.call('LPUSH', K_WAITS, prio .. ':' .. fmt(wait_ms))
  if n > WAITS_KEEP + WAITS_SLACK then redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1) end
end

-- Make id a holder with a fresh generation. Returns counter, lease deadline.
local function grant(st, id, prio, now, lease_ms)
  local counter = redis.call('HINCRBY', K_META, 'counter', 1)
  local deadline = now + lease_ms
  redis.call('ZADD', K_HOLDERS, deadline, id)
  redis.call('HSET', K_HINFO, id, fmt(st.epoch) .. ':' .. fmt(counter) .. ':' .. fmt(now) .. ':' .. prio)
  lower_reap_at(st, deadline)
  return counter, deadline
end

-- Remove a holder. info (its hinfo entry) is given when it released normally:
-- its hold time then feeds the EWMA.
local function unhold(st, id, now, info)
  redis.call('ZREM', K_HOLDERS, id)
  redis.call('HDEL', K_HINFO, id)
  if info then
    local _, _, granted = parse_hinfo(info)
    local hold = now - granted
    local ewma = st.ewma
    if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
    st.ewma, st.hold_n = ewma, st.hold_n + 1
    redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'hold_n', st.hold_n)
  end
end

-- Expired holder leases and lapsed waiters go first, a bounded number per
-- call; then reap_at is set to the earliest score left.
local function reap(st, now)
  local gone = redis.call('ZRANGEBYSCORE', K_HOLDERS, '-inf', now, 'LIMIT', 0, REAP_MAX)
  for i = 1, #gone do unhold(st, gone[i], now, nil) end
  if #gone > 0 then redis.call('HINCRBY', K_META, 'expired', #gone) end
  local lapsed = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, REAP_MAX)
  for i = 1, #lapsed do drop_waiter(lapsed[i], now) end
  local next_at = NEVER
  local h = redis.call('ZRANGE', K_HOLDERS, 0, 0, 'WITHSCORES')
  if #h == 2 then next_at = tonumber(h[2]) end
  local w = redis.call('ZRANGE', K_WEXP, 0, 0, 'WITHSCORES')
  if #w == 2 and tonumber(w[2]) < next_at then next_at = tonumber(w[2]) end
  if next_at ~= st.reap_at then
    st.reap_at = next_at
    redis.call('HSET', K_META, 'reap_at', fmt(next_at))
  end
end

-- The hot paths' reap: nothing to do until the earliest deadline has passed.
local function reap_due(st, now)
  if now >= st.reap_at then reap(st, now) end
end

-- Direct handoff: give free slots to head waiters, waking exactly each one
-- through its process's channel. The grant itself lives in hinfo (the
-- waiter's mailbox); the message is only the doorbell, and a waiter whose
-- doorbell is lost finds the grant at its next renewal.
-- Returns true when slots and waiters remain after GRANT_MAX steps.
local function grant_free(st, now, lease_ms)
  if now < st.quiet_until then return false end
  local free = st.width - redis.call('ZCARD', K_HOLDERS)
  local steps = 0
  while free > 0 and steps < GRANT_MAX do
    steps = steps + 1
    local head = redis.call('ZRANGE', K_QUEUE, 0, 0)
    if #head == 0 then return false end
    local id = head[1]
    local exp = tonumber(redis.call('ZSCORE', K_WEXP, id))
    if exp == nil or exp <= now then
      drop_waiter(id, now)
    else
      local info = unqueue(id)
      local prio, enq, _, notify, channel = parse_winfo(info)
      local counter = grant(st, id, prio, now, lease_ms)
      local heard = redis.call('PUBLISH', channel,
        id .. ' ' .. fmt(st.epoch) .. ' ' .. fmt(counter))
      if notify and heard == 0 then
        -- Nobody listens for this waiter: its process is gone. Take the
        -- slot back at once rather than strand it for a lease period.
        unhold(st, id, now, nil)
        redis.call('HINCRBY', K_META, 'returned', 1)
        redis.call('HINCRBY', K_META, 'lapsed', 1)
      else
        record_wait(prio, now - enq)
        free = free - 1
      end
    end
  end
  return free > 0 and redis.call('ZCARD', K_QUEUE) > 0
end

-- Milliseconds until the next thing that may free a slot without anyone
-- acting: the earliest holder lease expiry, or the end of a quiet period.
-- -1 when there is none. Waiters' processes wake then to reap and hand off.
local function next_event(st, now)
  local best = -1
  local first = redis.call('ZRANGE', K_HOLDERS, 0, 0, 'WITHSCORES')
  if #first == 2 then best = tonumber(first[2]) - now + 1 end
  if st.quiet_until > now and (best < 0 or st.quiet_until - now < best) then
    best = st.quiet_until - now
  end
  if best >= 0 and best < 1 then best = 1 end
  return best
end
