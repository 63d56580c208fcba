-- What would a call to this backend meet now? Reads only: claiming the
-- half-open trial is breaker_claim.lua, done once a lane slot is held.
--
-- KEYS[1]  breaker state hash  {<prefix>:breaker:<model>}:state
--          fields: opened_until (ms, server time), trial_until (ms), trial_owner
--
-- Returns 'closed' (call), 'half_open' (the cool-down is over and no trial
-- runs: a trial may be claimed) or 'open' (do not call).
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
return 'half_open'
