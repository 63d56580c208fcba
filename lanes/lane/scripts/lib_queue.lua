-- lib_queue.lua: waiter entries (queue, wexp and wfq; the member is the record)
-- and the share books' waiting counts.
--! include base

-- The fields of a waiter's member: notify ('1'/'0'), timeout_ms, id, the
-- waiter's own lease (ms), which a slot handed to it gets, and its workflow
-- ('' when the member has no workflow part).
local function parse_waiter(member)
  local notify, timeout, lease, id, wf = string.match(member, '^(%d):(%-?%d+):(%d+):([^:]+):?(.*)$')
  return notify, tonumber(timeout), id, tonumber(lease), wf
end

-- The wake channel of the process a waiter id belongs to.
local function channel_of(id)
  local token = string.match(id, '^(.*)%.[^.]*$') or id
  return string.sub(K_META, 1, string.find(K_META, ':{', 1, true)) .. 'wake:' .. token
end

-- The server time (ms) at which a waiter queued, from its score (see seq, lib_base.lua).
local function enqueued_ms(st, score)
  return st.epoch + math.floor((score % PRIO_SPAN) / 1000)
end

-- A waiter's wait deadline (ms), or nil for no limit.
local function wait_deadline(st, score, timeout)
  if timeout < 0 then return nil end
  return enqueued_ms(st, score) + timeout
end

-- A waiter's entry in wfq: its workflow's queue at its priority, in arrival order.
local function wfq_entry(prio, wf, seq, member)
  return prio .. ':' .. #wf .. ':' .. wf .. ':' .. string.format('%016d', seq) .. ':' .. member
end

-- The waiting count of (prio, wf) moved by n; n:<prio> (workflows waiting)
-- and meta mw (priorities with two or more) follow it.
local function note_waiting(prio, wf, n)
  local left = redis.call('HINCRBY', K_SHARES, 'w:' .. prio .. ':' .. wf, n)
  local was = left - n
  if left <= 0 then redis.call('HDEL', K_SHARES, 'w:' .. prio .. ':' .. wf) end
  if was <= 0 and left > 0 then
    if redis.call('HINCRBY', K_SHARES, 'n:' .. prio, 1) == 2 then redis.call('HINCRBY', K_META, 'mw', 1) end
  elseif was > 0 and left <= 0 then
    local workflows = redis.call('HINCRBY', K_SHARES, 'n:' .. prio, -1)
    if workflows == 1 then redis.call('HINCRBY', K_META, 'mw', -1) end
    if workflows <= 0 then redis.call('HDEL', K_SHARES, 'n:' .. prio) end
  end
end

-- A waiter joins: queue (by priority, then arrival), wexp, wfq and the books.
local function queue_add(member, prio, seq, wexp)
  local _, _, _, _, wf = parse_waiter(member)
  -- fmt: '..' and redis.call would write this 16-digit score in 14 digits.
  redis.call('ZADD', K_QUEUE, fmt(prio * PRIO_SPAN + seq), member)
  redis.call('ZADD', K_WEXP, wexp, member)
  redis.call('ZADD', K_WFQ, 0, wfq_entry(prio, wf, seq, member))
  note_waiting(prio, wf, 1)
end

-- A waiter leaves the queue (granted, gone or lapsed). score: its queue
-- score. Returns its workflow.
local function queue_remove(member, score)
  redis.call('ZREM', K_QUEUE, member)
  redis.call('ZREM', K_WEXP, member)
  local _, _, _, _, wf = parse_waiter(member)
  local prio = math.floor(score / PRIO_SPAN)
  if redis.call('ZREM', K_WFQ, wfq_entry(prio, wf, score % PRIO_SPAN, member)) == 1 then
    note_waiting(prio, wf, -1)
  end
  return wf
end

-- A waiter leaves without a grant: count why (its own deadline, or its lease).
local function drop_waiter(st, member, now)
  local score = tonumber(redis.call('ZSCORE', K_QUEUE, member))
  if not score then
    redis.call('ZREM', K_WEXP, member)
    return
  end
  queue_remove(member, score)
  local _, timeout = parse_waiter(member)
  local deadline = wait_deadline(st, score, timeout)
  if deadline and deadline <= now then
    redis.call('HINCRBY', K_META, 'timeouts', 1)
  else
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  end
end
