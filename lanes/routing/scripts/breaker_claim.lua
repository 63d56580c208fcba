-- What would a call to this backend meet now, and (with an owner) claim the
-- half-open trial, holding a lane slot already. One script for both, so the
-- check and the claim can never disagree about the state.
--
-- KEYS[1]  breaker state hash  {<prefix>:breaker:<model>}:state
--          fields: opened_until (ms, server time), trial_until (ms), trial_owner
-- ARGV[1]  trial_ms: how long this trial may run before another one is let in
--          (the caller passes at least its call's timeout, so two trials never
--          overlap); unused when only checking
-- ARGV[2]  owner: the claimer's token, so only it can give the trial back;
--          absent or '' = only check, write nothing
--
-- Returns 'closed' (call: no trial needed), 'open' (do not call), and when
-- the cool-down is over and no trial runs: 'trial' (claimed: you are the one
-- half-open trial) or, when only checking, 'half_open' (a trial may be claimed).
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
if not ARGV[2] or ARGV[2] == '' then
  return 'half_open'
end
redis.call('HSET', KEYS[1], 'trial_until', now + tonumber(ARGV[1]), 'trial_owner', ARGV[2])
return 'trial'
