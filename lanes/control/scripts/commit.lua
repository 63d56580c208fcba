-- commit.lua: the leader writes one decision; a deposed leader's write is refused.
-- KEYS[1] leader  {prefix:control:<pool id>}:leader  string "<token>|<fence>"
-- KEYS[2] state   {prefix:control:<pool id>}:state   hash (see lanes/control/store.py)
-- ARGV[1] lease        "<token>|<fence>" as the caller holds it
-- ARGV[2] new_gen      '1': a width change starts a new generation (per-generation counts restart)
-- ARGV[3] completions  completions the decision consumed (subtracted, so later ones are kept)
-- ARGV[4] served_seconds  served call-seconds the decision consumed (subtracted likewise)
-- ARGV[5..] field, value pairs to set
-- Returns the generation in effect after the write, or -1 when the lease is not the caller's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local generation
if ARGV[2] == '1' then
  generation = redis.call('HINCRBY', KEYS[2], 'generation', 1)
  redis.call('HSET', KEYS[2], 'admitted', 0, 'overloads', 0)
  redis.call('HDEL', KEYS[2], 'overload_in_flight')
else
  generation = tonumber(redis.call('HGET', KEYS[2], 'generation') or '0')
  if generation == 0 then redis.call('HSET', KEYS[2], 'generation', 0) end
end
local consumed = tonumber(ARGV[3])
if consumed > 0 then
  redis.call('HINCRBY', KEYS[2], 'completions', -consumed)
end
if tonumber(ARGV[4]) > 0 then
  redis.call('HINCRBYFLOAT', KEYS[2], 'served_seconds', -tonumber(ARGV[4]))
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return generation
