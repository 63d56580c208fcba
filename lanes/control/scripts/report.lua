-- report.lua: one backend outcome of a pool under control.
-- KEYS[1] state   {prefix:control:<pool id>}:state   hash
-- ARGV[1] what        'served' | 'overload' | 'background' (an overload answer to background work)
-- ARGV[2] generation  the generation the request was admitted under ('' when unknown)
-- ARGV[3] in_flight   the lane's in-flight count when the answer came ('' when unknown)
-- ARGV[4] status      the HTTP status of an overload answer
-- ARGV[5] seconds     how long a served call took
-- Returns 1 when the report counts for the current generation, else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[1] == 'served' then
  redis.call('HINCRBY', KEYS[1], 'completions', 1)
  redis.call('HINCRBYFLOAT', KEYS[1], 'served_seconds', ARGV[5])
  return 1
end
redis.call('HINCRBY', KEYS[1], 'rejections:' .. ARGV[4], 1)
if ARGV[1] == 'background' then
  -- Background overflowed on top of interactive work: never a reason to cut.
  redis.call('HINCRBY', KEYS[1], 'background_overloads', 1)
  return 0
end
if redis.call('HGET', KEYS[1], 'generation') == ARGV[2] then
  redis.call('HINCRBY', KEYS[1], 'overloads', 1)
  if ARGV[3] ~= '' then
    redis.call('HSETNX', KEYS[1], 'overload_in_flight', ARGV[3])
  end
  return 1
end
redis.call('HINCRBY', KEYS[1], 'stale_overloads', 1)
return 0
