-- Start one delivery of a routed task, in one round trip: the finished
-- check, the run lease and the STARTED state that Celery's tracer would
-- otherwise store with two more (a read of the result, then the write).
--
-- KEYS[1]  the task's run lease   {prefix}:run:<task id>   (string: the holder's token)
-- KEYS[2]  the task's Celery result   celery-task-meta-<task id>   (string: JSON)
-- KEYS[3]  the task's revoke mark   {prefix}:revoked:<task id>   (set by a revoke through Lanes)
-- ARGV[1]  this delivery's token
-- ARGV[2]  the lease's time to live, ms
-- ARGV[3]  the STARTED result to store, encoded as Celery's backend encodes it
-- ARGV[4]  the result's time to live, seconds (0: none, as result_expires=None)
--
-- Returns {'finished', state} when the task already ended (nothing written),
-- {'revoked'} when it was revoked before this delivery (nothing written: the
-- worker stores REVOKED as Celery does, with the task's request),
-- {'busy'} when another delivery holds the lease (nothing written), and
-- {'run'} when this delivery holds the lease and the result says STARTED
-- (published on the result's key as Celery's Redis backend does).
local stored = redis.call('GET', KEYS[2])
if stored then
  local ok, meta = pcall(cjson.decode, stored)
  local state = ok and type(meta) == 'table' and meta['status'] or nil
  if state == 'SUCCESS' or state == 'FAILURE' or state == 'REVOKED' then
    return {'finished', state}
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {'revoked'}
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'busy'}
end
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
else
  redis.call('SET', KEYS[2], ARGV[3])
end
redis.call('PUBLISH', KEYS[2], ARGV[3])
return {'run'}
