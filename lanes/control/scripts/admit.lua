-- admit.lua: a request was granted a slot; count it under the current generation.
-- KEYS[1] state   {prefix:control:<pool id>}:state   hash
-- Returns the generation the request is admitted under, or nil when no controller state exists.
local generation = redis.call('HGET', KEYS[1], 'generation')
if not generation then
  return false
end
redis.call('HINCRBY', KEYS[1], 'admitted', 1)
return tonumber(generation)
