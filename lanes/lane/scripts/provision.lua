-- provision.lua: create a lane's state with no quiet period, only if absent.
-- For an owner that knows no holder of this lane can be alive (a pool just
-- created in the catalog, a benchmark's fresh lane). After a Redis state loss
-- use the ordinary path instead: its quiet period is what prevents over-admission.
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] width
-- ARGV[2] run       run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns 1 if the state was created, 0 if it existed.
--! include base
if redis.call('EXISTS', K_META) == 1 then return 0 end
local now = now_ms()
redis.call('DEL', K_HOLDERS, K_HINFO, K_QUEUE, K_WEXP, K_SHARES, K_WFQ)
redis.call('HSET', K_META, 'width', ARGV[1], 'epoch', fmt(now), 'counter', 0, 'inflight', 0, 'seq', 0,
  'quiet_until', fmt(now), 'run', RUN)
return 1
