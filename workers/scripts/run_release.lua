-- End a task's run lease, if it is still the caller's.
--
-- KEYS[1]  the task's run lease  {prefix}:run:<task id>  (string: the holder's token)
-- ARGV[1]  the holder's token
--
-- Returns 1 when the lease was ended, 0 when it was not (or no longer) the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
