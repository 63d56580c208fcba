-- Take one message for a consumer and record it as unacknowledged, in one step
-- (lanes/broker.py says why): the message is never outside Redis unrecorded.
--
-- KEYS[1..n]   the queues' lists in kombu's order (each priority step, then each queue)
-- KEYS[n+1]    kombu's unacknowledged hash (delivery tag -> [message, exchange, routing key])
-- KEYS[n+2]    its index (delivery tag -> time taken)
-- KEYS[n+3..]  the queues' bells (streams one entry long, added to by every publish)
-- ARGV[1]      n
-- ARGV[2]      the time taken (the consumer's clock, as kombu records it)
--
-- Returns {i, message, 1} when the message of KEYS[i] was taken and recorded,
-- {i, message, 0} when it was taken but cannot be recorded (not a kombu
-- message: kombu's own record and its error take over), or {0, id...}, each
-- bell's last entry id, when every queue is empty: a wait for entries after
-- those ids misses no publish made since this call.
local n = tonumber(ARGV[1])

local function json(value)
  if value == nil then return 'null' end
  return cjson.encode(value)
end

for i = 1, n do
  local raw = redis.call('LINDEX', KEYS[i], -1)
  if raw then
    local ok, message = pcall(cjson.decode, raw)
    local properties = ok and type(message) == 'table' and message['properties']
    local info = type(properties) == 'table' and properties['delivery_info']
    local tag = type(properties) == 'table' and properties['delivery_tag']
    if type(tag) == 'string' and type(info) == 'table' then
      -- Recorded before it leaves its list: a write refused by a full server
      -- (Redis 6 runs a script up to its first refused write) leaves it queued.
      -- The message is kept as sent, never re-encoded.
      redis.call('HSET', KEYS[n + 1], tag,
        '[' .. raw .. ',' .. json(info['exchange']) .. ',' .. json(info['routing_key']) .. ']')
      redis.call('ZADD', KEYS[n + 2], ARGV[2], tag)
      redis.call('RPOP', KEYS[i])
      return {i, raw, 1}
    end
    redis.call('RPOP', KEYS[i])
    return {i, raw, 0}
  end
end

local ids = {0}
for j = n + 3, #KEYS do
  local last = redis.call('XREVRANGE', KEYS[j], '+', '-', 'COUNT', 1)[1]
  ids[#ids + 1] = last and last[1] or '0-0'
end
return ids
