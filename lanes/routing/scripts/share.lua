-- One workflow's failover share (seed 003): read it, or record one outcome of a primary attempt.
--
-- KEYS[1]  share state hash   fields: share, generation, sig, changed_at, healthy_since, breaches,
--                              parked, unknown, decision, blocked_at
-- KEYS[2]  outcome window list (newest first; '1' breach, '0' healthy), this generation's only
-- ARGV[1]  'tick'    apply idle recovery, then return the share (a request is about to choose)
--          'record'  add one outcome (ARGV[13], ARGV[14]), then decide
--          'unknown' count an unknown outcome (never in the window, never a veto)
--          'blocked' the primary's breaker kept a request from trying it: nothing is learned,
--                    and idle recovery credits no interval that began before now (the
--                    primary is not idle and recovering, it is not being tried at all)
-- ARGV[2]  signature of the configuration (parameters, deadline, primary identity): a different
--          one retires the controller and its successor starts at 1.0
-- ARGV[3]  now, in ms (the caller's injected clock)
-- ARGV[4]  share_step         ARGV[5]  share_decay      ARGV[6]  share_floor
-- ARGV[7]  breach_rate_target ARGV[8]  recovery_breach_rate
-- ARGV[9]  window_samples     ARGV[10] min_samples      ARGV[11] dwell_ms   ARGV[12] idle_recovery_ms
-- ARGV[13] 'record': '1' breach, '0' healthy
-- ARGV[14] 'record': the generation the attempt began under (another one is ignored)
--
-- Returns {share, generation, change, previous share, samples, breaches, decided samples,
-- decided breaches} with the shares as strings (Redis would truncate a Lua number); change is
-- '' or one of started, retired, resumed, decrease, increase, idle_recovery, held (the first
-- 'blocked' after a change), stale (a 'record' of an old generation). samples and breaches
-- are the window now; the decided ones are the window the change was decided on (a decrease
-- empties the window after deciding; otherwise the two are the same).
local state, window = KEYS[1], KEYS[2]
local op, sig, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local step, decay, floor = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local target, recovery = tonumber(ARGV[7]), tonumber(ARGV[8])
local window_samples, min_samples = tonumber(ARGV[9]), tonumber(ARGV[10])
local dwell, idle = tonumber(ARGV[11]), tonumber(ARGV[12])

local f = redis.call('HMGET', state, 'share', 'generation', 'sig', 'changed_at', 'healthy_since', 'breaches', 'parked',
                    'blocked_at', 'decision')
local share, generation = tonumber(f[1]), tonumber(f[2]) or 0
local changed_at, healthy_since, breaches = tonumber(f[4]), tonumber(f[5]), tonumber(f[6]) or 0
local blocked_at = tonumber(f[8])
local previous = share
local change = ''
local decided_samples, decided_breaches = nil, nil

local function reply()
  local now_samples = redis.call('LLEN', window)
  return {tostring(share), generation, change, tostring(previous or share), now_samples, breaches,
          decided_samples or now_samples, decided_breaches or breaches}
end

if share == nil or f[3] ~= sig then
  -- No controller yet, or one learned under another configuration: start afresh.
  change = share == nil and 'started' or 'retired'
  -- Starting is not a change: the first decision need not wait a dwell.
  share, generation, changed_at, breaches = 1.0, generation + 1, now - dwell, 0
  healthy_since = nil
  redis.call('DEL', window)
  redis.call('HSET', state, 'share', tostring(share), 'generation', generation, 'sig', sig,
             'changed_at', changed_at, 'breaches', 0, 'parked', 0, 'decision', change)
  redis.call('HDEL', state, 'healthy_since', 'blocked_at')
  blocked_at = nil
elseif f[7] == '1' then
  -- Parked while the workflow had one candidate: resume with the learned share.
  change = 'resumed'
  redis.call('HSET', state, 'parked', 0, 'decision', change)
end

if op == 'unknown' then
  redis.call('HINCRBY', state, 'unknown', 1)
  return reply()
end

if op == 'blocked' then
  -- The breaker kept the primary from being tried: no outcome, and the idle
  -- clock starts again from now (it measures a primary tried too rarely to
  -- judge, not one that is not tried at all).
  redis.call('HSET', state, 'blocked_at', now)
  if change == '' and f[9] ~= 'held' then
    change = 'held'
    redis.call('HSET', state, 'decision', change)
  end
  return reply()
end

-- Idle recovery: a step for each idle interval the window went without enough samples to
-- judge, counted from the last change or the last time the breaker held the primary back.
local samples = redis.call('LLEN', window)
local idle_since = math.max(changed_at, blocked_at or changed_at)
if idle > 0 and share < 1 and samples < min_samples and now - idle_since >= idle then
  local credits = math.floor((now - idle_since) / idle)
  share = math.min(1.0, share + credits * step)
  changed_at = now
  change = 'idle_recovery'
  redis.call('HSET', state, 'share', tostring(share), 'changed_at', changed_at, 'decision', change)
end

if op ~= 'record' then
  return reply()
end
if tonumber(ARGV[14]) ~= generation then
  -- Began under a share a decrease has replaced: says nothing about the new one.
  change = 'stale'
  return reply()
end

local breach = ARGV[13] == '1'
redis.call('LPUSH', window, breach and '1' or '0')
if breach then breaches = breaches + 1 end
if redis.call('LLEN', window) > window_samples then
  if redis.call('RPOP', window) == '1' then breaches = breaches - 1 end
end
samples = redis.call('LLEN', window)

if samples >= min_samples then
  local rate = breaches / samples
  local dwelt = now - changed_at >= dwell
  if rate > target then
    healthy_since = nil
    if dwelt then
      -- Decrease: a new generation with an empty window (every change is followed by a dwell).
      local cut = math.max(floor, share * decay)
      if cut < share then change = 'decrease' else change = 'floor' end
      decided_samples, decided_breaches = samples, breaches
      share, generation, changed_at, breaches = cut, generation + 1, now, 0
      redis.call('DEL', window)
    end
  elseif rate <= recovery then
    healthy_since = healthy_since or now
    if share < 1 and dwelt and now - healthy_since >= dwell then
      -- Increase: the window is kept; the next step needs another dwell at the new share.
      share = math.min(1.0, share + step)
      changed_at, healthy_since = now, now
      change = 'increase'
    end
  else
    healthy_since = nil  -- inside the band: hold
  end
end

redis.call('HSET', state, 'share', tostring(share), 'generation', generation, 'changed_at', changed_at,
           'breaches', breaches)
if healthy_since then
  redis.call('HSET', state, 'healthy_since', healthy_since)
else
  redis.call('HDEL', state, 'healthy_since')
end
if change ~= '' then redis.call('HSET', state, 'decision', change) end
return reply()
