-- replica_release.lua: a call on a replica ended.
-- KEYS[1] counts  {prefix:replicas:<pool id>}:counts  hash   endpoint -> calls in flight
-- KEYS[2] calls   {prefix:replicas:<pool id>}:calls   zset   "<endpoint>\n<call id>" -> lease deadline (ms)
-- ARGV[1] endpoint; ARGV[2] call id
-- Returns 1 when the call was counted (0: released already, or reaped after its lease).
if redis.call('ZREM', KEYS[2], ARGV[1] .. '\n' .. ARGV[2]) == 0 then
  return 0
end
if tonumber(redis.call('HINCRBY', KEYS[1], ARGV[1], -1)) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
