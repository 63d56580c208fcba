-- lease.lua: take or renew a pool's control-loop lease, with a fencing number.
-- KEYS[1] leader  {prefix:control:<pool id>}:leader  string "<token>|<fence>", expires
-- KEYS[2] state   {prefix:control:<pool id>}:state   hash; field 'fence' counts leases ever taken
-- ARGV[1] token   the asking process's unique token
-- ARGV[2] ttl_ms  how long the lease lasts unless renewed
-- Returns the fence of the lease the caller holds now, or 0 when another holds it.
local current = redis.call('GET', KEYS[1])
if current then
  local token, fence = string.match(current, '^(.*)|(%d+)$')
  if token == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(fence)
  end
  return 0
end
local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'PX', ARGV[2])
return fence
