-- Extend the run leases a worker still holds (workers/runs.py).
-- KEYS: the run-lease keys; ARGV[1]: the time to live (ms); ARGV[2..]: the
-- token of each key, in order. A lease that lapsed or another delivery took
-- is left alone. Returns how many were extended.
local ttl = tonumber(ARGV[1])
local renewed = 0
for i, key in ipairs(KEYS) do
  if redis.call("GET", key) == ARGV[i + 1] then
    redis.call("PEXPIRE", key, ttl)
    renewed = renewed + 1
  end
end
return renewed
