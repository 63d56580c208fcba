-- lib_queue.lua: waiter entries (queue, wexp and wfq; the member is the record).
--! include base

-- The fields of a waiter's member: notify ('1'/'0'), timeout_ms, id, the
-- waiter's own lease (ms), which a slot handed to it gets, and its workflow
-- ('' when the member has no workflow part).
local function parse_waiter(member)
  local notify, timeout, lease, id, wf = string.match(member, '^(%d):(%-?%d+):(%d+):([^:]+):?(.*)$')
  return notify, tonumber(timeout), id, tonumber(lease), wf
end

-- The token of the process a waiter or holder id belongs to.
local function token_of(id)
  return string.match(id, '^(.*)%.[^.]*$') or id
end

-- The wake channel of the process a waiter id belongs to.
local function channel_of(id)
  return string.sub(K_META, 1, string.find(K_META, ':{', 1, true)) .. 'wake:' .. token_of(id)
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

-- A waiter joins: queue (by priority, then arrival) and wexp; and wfq once
-- a second workflow has queued on this state (meta multi, see lib_base.lua).
-- The first time one does, every waiter already queued is put in wfq too
-- (once per lane state; a lane that only ever sees one workflow has none).
local function queue_add(st, member, prio, seq, wexp)
  local _, _, _, _, wf = parse_waiter(member)
  if st.multi ~= '1' then
    if not st.wf1 then
      st.wf1 = wf
      redis.call('HSET', K_META, 'wf1', wf)
    elseif st.wf1 ~= wf then
      st.multi = '1'
      redis.call('HSET', K_META, 'multi', '1')
      local all = redis.call('ZRANGE', K_QUEUE, 0, -1, 'WITHSCORES')
      for i = 1, #all, 2 do
        local score = tonumber(all[i + 1])
        local _, _, _, _, other = parse_waiter(all[i])
        redis.call('ZADD', K_WFQ, 0, wfq_entry(math.floor(score / PRIO_SPAN), other, score % PRIO_SPAN, all[i]))
      end
    end
  end
  -- fmt: '..' and redis.call would write this 16-digit score in 14 digits.
  redis.call('ZADD', K_QUEUE, fmt(prio * PRIO_SPAN + seq), member)
  redis.call('ZADD', K_WEXP, wexp, member)
  if st.multi == '1' then redis.call('ZADD', K_WFQ, 0, wfq_entry(prio, wf, seq, member)) end
end

-- A waiter leaves the queue (granted, gone or lapsed). score: its queue
-- score. Returns its workflow.
local function queue_remove(st, member, score)
  redis.call('ZREM', K_QUEUE, member)
  redis.call('ZREM', K_WEXP, member)
  local _, _, _, _, wf = parse_waiter(member)
  if st.multi == '1' then
    redis.call('ZREM', K_WFQ, wfq_entry(math.floor(score / PRIO_SPAN), wf, score % PRIO_SPAN, member))
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
  queue_remove(st, member, score)
  local _, timeout = parse_waiter(member)
  local deadline = wait_deadline(st, score, timeout)
  if deadline and deadline <= now then
    redis.call('HINCRBY', K_META, 'timeouts', 1)
  else
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  end
end
