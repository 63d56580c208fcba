-- Move the messages of a queue nobody consumes any more (a renamed fleet's old
-- queue) to the front of its successor, oldest first served, rewriting the
-- route each message carries so a later requeue or restore lands in the new
-- queue and not back in the old one.
--
-- KEYS[1]  the old queue's list at one priority step (kombu: LPUSH in, BRPOP out)
-- KEYS[2]  the new queue's list at the same priority step
-- KEYS[3]  the new queue's bell (lanes/broker.py): rung when anything moved, so a
--          worker waiting on the new queue takes the messages at once
-- ARGV[1]  old queue name (the exchange and routing key Celery gave the message)
-- ARGV[2]  new queue name
-- ARGV[3]  at most this many messages per call (the script must stay short)
--
-- Returns the number of messages moved.
local moved = 0
for _ = 1, tonumber(ARGV[3]) do
  -- Newest first out of the old list, each pushed on the serving end of the
  -- new one: the oldest ends up served first, the order kept.
  local raw = redis.call('LPOP', KEYS[1])
  if not raw then
    break
  end
  local ok, message = pcall(cjson.decode, raw)
  if ok and type(message) == 'table' and type(message['properties']) == 'table' then
    local info = message['properties']['delivery_info']
    if type(info) == 'table' then
      if info['exchange'] == ARGV[1] then info['exchange'] = ARGV[2] end
      if info['routing_key'] == ARGV[1] then info['routing_key'] = ARGV[2] end
      raw = cjson.encode(message)
    end
  end
  redis.call('RPUSH', KEYS[2], raw)
  moved = moved + 1
end
if moved > 0 then
  redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'm', '')
end
return moved
