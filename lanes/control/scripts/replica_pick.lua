-- replica_pick.lua: choose the replica of a pool for one call, and count the call on it.
-- KEYS[1] counts  {prefix:replicas:<pool id>}:counts  hash   endpoint -> calls in flight (fleet-wide)
-- KEYS[2] calls   {prefix:replicas:<pool id>}:calls   zset   "<endpoint>\n<call id>" -> lease deadline (ms)
-- KEYS[3] down    {prefix:replicas:<pool id>}:down    hash   endpoint -> marked down until (ms)
-- KEYS[4] load    {prefix:replicas:<pool id>}:load    hash   endpoint -> running by the last scrape
-- ARGV[1] call id; ARGV[2] lease ms; ARGV[3..] the pool's endpoints, in catalog order
-- Returns the chosen endpoint.
-- Calls whose lease lapsed (a worker that died mid-call) are reaped first, so a
-- crash never leaves a replica looking busy for longer than one lease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, member in ipairs(lapsed) do
  local endpoint = string.match(member, '^(.-)\n')
  if endpoint and tonumber(redis.call('HINCRBY', KEYS[1], endpoint, -1)) <= 0 then
    redis.call('HDEL', KEYS[1], endpoint)
  end
  redis.call('ZREM', KEYS[2], member)
end
local best, best_count, best_load = nil, nil, nil
local function consider(endpoint)
  local count = tonumber(redis.call('HGET', KEYS[1], endpoint) or '0')
  local load = tonumber(redis.call('HGET', KEYS[4], endpoint) or '0')
  if best == nil or count < best_count or (count == best_count and load < best_load) then
    best, best_count, best_load = endpoint, count, load
  end
end
for i = 3, #ARGV do
  local until_ms = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '0')
  if until_ms <= now then
    consider(ARGV[i])
  end
end
if best == nil then
  -- Every replica is marked down: try them all rather than refuse the call
  -- (the marks may be older news than the replicas' recovery).
  for i = 3, #ARGV do
    consider(ARGV[i])
  end
end
redis.call('HINCRBY', KEYS[1], best, 1)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), best .. '\n' .. ARGV[1])
return best
