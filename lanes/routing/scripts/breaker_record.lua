-- Record one call outcome and open or close the breaker.
--
-- KEYS[1]  breaker state hash  fields: consecutive, failures (in window), opened_until, trial_until, trial_owner
-- KEYS[2]  outcome window list (newest first; '1' failure, '0' success)
-- ARGV[1]  1 success, 0 failure
-- ARGV[2]  consecutive failures that open the breaker
-- ARGV[3]  window size (outcomes kept)
-- ARGV[4]  minimum outcomes in the window before the failure rate counts
-- ARGV[5]  failure rate (0..1) that opens the breaker
-- ARGV[6]  cool-down in ms before a half-open trial
-- ARGV[7]  key time-to-live in ms
--
-- Returns 'closed' or 'open' (the state after this outcome).
local state, window = KEYS[1], KEYS[2]
local ok = ARGV[1] == '1'
local window_size = tonumber(ARGV[3])

redis.call('LPUSH', window, ok and '0' or '1')
local failures = tonumber(redis.call('HINCRBY', state, 'failures', ok and 0 or 1))
-- Keep the window bounded: drop the oldest outcome, and its failure with it.
if redis.call('LLEN', window) > window_size then
  if redis.call('RPOP', window) == '1' then
    failures = tonumber(redis.call('HINCRBY', state, 'failures', -1))
  end
end
redis.call('PEXPIRE', window, ARGV[7])
redis.call('PEXPIRE', state, ARGV[7])

if ok then
  redis.call('HSET', state, 'consecutive', 0)
  redis.call('HDEL', state, 'opened_until', 'trial_until', 'trial_owner')
  return 'closed'
end

local consecutive = tonumber(redis.call('HINCRBY', state, 'consecutive', 1))
local samples = redis.call('LLEN', window)
local was_trial = redis.call('HEXISTS', state, 'trial_until') == 1
local rate_open = samples >= tonumber(ARGV[4]) and failures / samples >= tonumber(ARGV[5])
if was_trial or consecutive >= tonumber(ARGV[2]) or rate_open then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', state, 'opened_until', now + tonumber(ARGV[6]))
  redis.call('HDEL', state, 'trial_until', 'trial_owner')
  return 'open'
end
return 'closed'
