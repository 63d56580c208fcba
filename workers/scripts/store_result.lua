-- Store a task's state as Celery's Redis backend does (celery/backends/base.py
-- ``_store_result``), in one round trip: nothing once SUCCESS is stored (a lost
-- worker's late copy must not overwrite it), else SET with its expiry and PUBLISH
-- to the task's channel. Celery reads the state, then writes it: two round trips.
--
-- KEYS[1]  the task's Celery result   celery-task-meta-<task id>   (string: JSON)
-- ARGV[1]  the state to store, encoded as Celery's backend encodes it (JSON)
-- ARGV[2]  its time to live, ms (0: none)
--
-- Returns 1 when stored, 0 when a SUCCESS was there already.
local current = redis.call('GET', KEYS[1])
if current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then return 0 end
end
local ms = tonumber(ARGV[2])
if ms > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
