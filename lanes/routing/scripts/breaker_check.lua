-- May a call go to this backend now?
--
-- KEYS[1]  breaker state hash  {<prefix>:breaker:<model>}:state
--          fields: opened_until (ms, server time), trial_until (ms)
-- ARGV[1]  trial_ms: how long one half-open trial may take before another is allowed
--
-- Returns 'closed' (call), 'half_open' (call: you are the one trial) or 'open' (do not call).
local opened_until = tonumber(redis.call('HGET', KEYS[1], 'opened_until') or '0')
if opened_until == 0 then
  return 'closed'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < opened_until then
  return 'open'
end
local trial_until = tonumber(redis.call('HGET', KEYS[1], 'trial_until') or '0')
if now < trial_until then
  return 'open'
end
redis.call('HSET', KEYS[1], 'trial_until', now + tonumber(ARGV[1]))
return 'half_open'
