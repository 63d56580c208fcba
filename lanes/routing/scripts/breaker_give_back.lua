-- Give back a half-open trial that made no call (or a call that says nothing
-- about the backend), so the next request may take it at once.
--
-- KEYS[1]  breaker state hash  fields: trial_until, trial_owner
-- ARGV[1]  owner token given to breaker_claim.lua
--
-- Returns 1 when the trial was given back, 0 when it was not (or no longer) ours.
if redis.call('HGET', KEYS[1], 'trial_owner') ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'trial_until', 'trial_owner')
return 1
