-- Claim the right to call this backend, holding a lane slot already.
--
-- KEYS[1]  breaker state hash  {<prefix>:breaker:<model>}:state
--          fields: opened_until (ms, server time), trial_until (ms), trial_owner
-- ARGV[1]  trial_ms: how long this trial may run before another one is let in
--          (the caller passes at least its call's timeout, so two trials never
--          overlap)
-- ARGV[2]  owner: the claimer's token, so only it can give the trial back
--
-- Returns 'closed' (call: no trial needed), 'trial' (call: you are the one
-- half-open trial) or 'open' (do not call).
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
redis.call('HSET', KEYS[1], 'trial_until', now + tonumber(ARGV[1]), 'trial_owner', ARGV[2])
return 'trial'
