-- resize.lua: set the width at once. A shrink revokes nobody (holders drain);
-- a growth hands the new slots to waiters in this call (bounded; the client
-- calls again while 'more').
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] width     new width (>= 0)
-- ARGV[2] lease_ms  quiet period if the state must be made (a slot handed
--                   to a waiter gets the waiter's own lease)
-- ARGV[3] run       run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns {old_width, more}.
--! include reap handoff
local width, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local st = load_state(now, ARGV[1], lease_ms)
local old = st.width
redis.call('HSET', K_META, 'width', ARGV[1])
st.width = width
reap(st, now)
local more = grant_free(st, now)
return {old, more and 1 or 0}
