-- release.lua: a holder gives its slot back; the slot goes to the head waiter.
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] id        holder id
-- ARGV[2] epoch     generation the holder was given ...
-- ARGV[3] counter   ... both must match, or nothing changes (fencing)
-- ARGV[4] lease_ms  the releaser's lease (a slot handed off gets the waiter's
--                   own, carried in its queue entry)
-- ARGV[5] own       1 = the caller hands a grant to a waiter of its own
--                   process from the reply (lanes/lane/sync.py): no
--                   doorbell for such a waiter; 0 = every grant rings
-- ARGV[6] run       run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns {released (1/0), more (1/0)}: more = slots and waiters remain
-- beyond this call's bounded handoff; a lean handoff adds the waiter it
-- granted, the grant and whether its doorbell went out,
-- {.., waiter id, epoch, counter, rang (1/0)}: a waiter of the releaser's
-- own process takes its grant from the reply, without the doorbell's trip.
--! include base
local id, lease_ms = ARGV[1], tonumber(ARGV[4])
local now = now_ms()
-- The holder's entry first: its priority and workflow name its holder count
-- (meta h:<prio>:<wf>, lib_hold.lua), read and written with the rest of meta.
local info = redis.call('HGET', K_HINFO, id)
local epoch, counter, granted, hprio, hwf
if info then epoch, counter, granted, hprio, hwf = string.match(info, '^(%d+):(%d+):(%d+):(%d+):?(.*)$') end
local hfield = info and ('h:' .. hprio .. ':' .. hwf) or 'h:'
local m = redis.call('HMGET', K_META, 'epoch', 'reap_at', 'hold_ewma_ms', 'width', 'counter', 'inflight',
  'run', hfield, 'multi', 'y:' .. id)
local multi = m[9] == '1'   -- waiters are in wfq (lib_queue.lua queue_add)
if not m[1] then return {0, 0} end   -- state lost: nothing of ours is recorded
-- A state another server process wrote (RUN, lib_base.lua) is untrusted: the
-- slow path below starts it over (load_state), so nothing of ours is recorded.
local stale = RUN ~= '' and m[7] and m[7] ~= RUN
local released = 0
local inflight = tonumber(m[6]) or 0
local held = tonumber(m[8]) or 0   -- hfield's count, written with the other meta fields
local ewma   -- the hold-time EWMA with this hold fed in, written once below
if info and not stale and epoch == ARGV[2] and counter == ARGV[3] then
  -- Inline unhold (lib_hold.lua): inflight and the holder count move only
  -- if an entry went.
  if redis.call('ZREM', K_HOLDERS, id) == 1 then
    inflight = inflight - 1
    held = held - 1
  end
  redis.call('HDEL', K_HINFO, id)
  if m[10] then redis.call('HDEL', K_META, 'y:' .. id) end   -- asked to yield (lib_yield.lua)
  local hold = now - tonumber(granted)
  ewma = tonumber(m[3])
  if ewma == nil then ewma = hold else ewma = ewma + EWMA_ALPHA * (hold - ewma) end
  released = 1
end
local reap_at = tonumber(m[2]) or 0
-- Lean handoff (the hot path under load), inline: nothing due for reaping
-- (so not quiet either: reap_at is 0 then) and exactly one slot free: it
-- goes to the head waiter, popped with its record, unless another workflow
-- waits at the head's priority too (lib_share.lua then chooses, on the slow
-- path below). Nothing is due for reaping, so the head's wexp score (>=
-- reap_at > now) has not passed: the head is live. The same writes as
-- grant_free's step (lib_handoff.lua); inflight (moved by the entries
-- really removed and added), the counter, the holder count and the EWMA go
-- in one HSET.
local lean = not stale and now < reap_at and tonumber(m[4]) - inflight == 1
local head
if lean then
  head = redis.call('ZPOPMIN', K_QUEUE)
  if #head > 0 and multi then
    -- lib_share.lua several_wait, inline: the first and last wfq entries of
    -- the head's priority, "<p>:<#wf>:<wf>:...", name the same workflow?
    local p = math.floor(tonumber(head[2]) / PRIO_SPAN)
    local lo = redis.call('ZRANGEBYLEX', K_WFQ, '[' .. p .. ':', '[' .. p .. ':\255', 'LIMIT', 0, 1)
    if #lo > 0 then
      local hi = redis.call('ZREVRANGEBYLEX', K_WFQ, '[' .. p .. ':\255', '[' .. p .. ':', 'LIMIT', 0, 1)
      local ln, lrest = string.match(lo[1], '^%d+:(%d+):(.*)$')
      local hn, hrest = string.match(hi[1], '^%d+:(%d+):(.*)$')
      if ln ~= hn or string.sub(lrest, 1, tonumber(ln)) ~= string.sub(hrest, 1, tonumber(hn)) then
        redis.call('ZADD', K_QUEUE, head[2], head[1])   -- back in its place
        head = nil
      end
    end
  end
elseif not stale and now < reap_at and redis.call('ZCARD', K_QUEUE) == 0 then
  head = {}
end
if head and #head == 0 then
  -- Nobody waiting (the common release when the lane is not full).
  if ewma then
    redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'inflight', inflight, hfield, held)
  end
  return {released, 0}
end
if head then
  local member, score = head[1], tonumber(head[2])
  redis.call('ZREM', K_WEXP, member)
  -- lib_queue.lua parse_waiter: the lease is the waiter's own (it travels with its entry).
  local notify, own_lease, wid, wwf = string.match(member, '^(%d):%-?%d+:(%d+):([^:]+):?(.*)$')
  local prio = math.floor(score / PRIO_SPAN)
  -- lib_queue.lua queue_remove, inline.
  if multi then
    redis.call('ZREM', K_WFQ, prio .. ':' .. #wwf .. ':' .. wwf .. ':' .. string.format('%016d', score % PRIO_SPAN)
      .. ':' .. member)
  end
  local counter = (tonumber(m[5]) or 0) + 1
  local deadline = now + tonumber(own_lease)
  local wfield = 'h:' .. prio .. ':' .. wwf
  if redis.call('ZADD', K_HOLDERS, deadline, wid) == 1 then
    inflight = inflight + 1
    -- The new holder's count: folded into the HSET below when it is the
    -- releaser's own (one workflow handing to itself), else moved at once.
    if wfield == hfield then held = held + 1 else redis.call('HINCRBY', K_META, wfield, 1) end
  end
  if ewma then
    redis.call('HSET', K_META, 'counter', counter, 'hold_ewma_ms', tostring(ewma), 'inflight', inflight,
      hfield, held)
    ewma = nil
  else
    redis.call('HSET', K_META, 'counter', counter, 'inflight', inflight, hfield, held)
  end
  -- now, counter and prio are below 10^14: '..' writes them exactly.
  local winfo = m[1] .. ':' .. counter .. ':' .. now .. ':' .. prio
  if wwf ~= '' then winfo = winfo .. ':' .. wwf end
  redis.call('HSET', K_HINFO, wid, winfo)
  if deadline < reap_at then redis.call('HSET', K_META, 'reap_at', deadline) end
  -- lib_queue.lua token_of and channel_of, inline. A waiter of the
  -- releaser's own process (same token) is told by the reply alone: its
  -- process is alive (it is releasing), and no reading thread of it wakes
  -- for a doorbell that only repeats the reply.
  local wtoken = string.match(wid, '^(.*)%.[^.]*$') or wid
  local rang, heard = 1, 1
  if ARGV[5] == '1' and wtoken == (string.match(id, '^(.*)%.[^.]*$') or id) then
    rang = 0
  else
    local channel = string.sub(K_META, 1, string.find(K_META, ':{', 1, true)) .. 'wake:' .. wtoken
    heard = redis.call('PUBLISH', channel, wid .. ' ' .. m[1] .. ' ' .. counter)
  end
  if notify == '1' and heard == 0 then
    -- Nobody listens for this waiter: take the slot back (as grant_free
    -- does) and let the slow path below hand it to the next one.
    if redis.call('ZREM', K_HOLDERS, wid) == 1 then
      inflight = inflight - 1
      redis.call('HINCRBY', K_META, wfield, -1)
    end
    redis.call('HDEL', K_HINFO, wid)
    redis.call('HSET', K_META, 'inflight', inflight)
    redis.call('HINCRBY', K_META, 'returned', 1)
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  else
    local wait = now - (tonumber(m[1]) + math.floor((score % PRIO_SPAN) / 1000))
    if wait < 0 then wait = 0 end
    if redis.call('LPUSH', K_WAITS, prio .. ':' .. wait) > WAITS_KEEP + WAITS_SLACK then
      redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1)
    end
    return {released, 0, wid, m[1], counter, rang}   -- the one free slot is taken: nothing more
  end
elseif ewma then
  redis.call('HSET', K_META, 'hold_ewma_ms', tostring(ewma), 'inflight', inflight, hfield, held)
end

--! include reap handoff
local st = load_state(now, '', lease_ms)
reap_due(st, now)
local more = false
if redis.call('ZCARD', K_QUEUE) > 0 then more = grant_free(st, now) end
return {released, more and 1 or 0}
