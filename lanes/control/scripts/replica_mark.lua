-- replica_mark.lua: mark a replica down for a while (unreachable), or up again.
-- KEYS[1] down    {prefix:replicas:<pool id>}:down    hash   endpoint -> marked down until (ms)
-- ARGV[1] endpoint; ARGV[2] ms to keep it down (0: up again)
-- Returns 1.
if tonumber(ARGV[2]) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
return 1
