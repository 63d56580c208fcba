-- lib_queue.lua: waiter entries (queue and wexp; the member is the record).
--! include base

-- The fields of a waiter's member: notify ('1'/'0'), timeout_ms, id, and the
-- waiter's own lease (ms), which a slot handed to it gets.
local function parse_waiter(member)
  local notify, timeout, lease, id = string.match(member, '^(%d):(%-?%d+):(%d+):(.+)$')
  return notify, tonumber(timeout), id, tonumber(lease)
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

-- A waiter leaves without a grant: count why (its own deadline, or its lease).
local function drop_waiter(st, member, now)
  local score = tonumber(redis.call('ZSCORE', K_QUEUE, member))
  redis.call('ZREM', K_QUEUE, member)
  redis.call('ZREM', K_WEXP, member)
  if not score then return end
  local _, timeout = parse_waiter(member)
  local deadline = wait_deadline(st, score, timeout)
  if deadline and deadline <= now then
    redis.call('HINCRBY', K_META, 'timeouts', 1)
  else
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  end
end
