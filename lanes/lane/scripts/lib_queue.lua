-- lib_queue.lua: waiter entries (queue, wexp, winfo).
--! include base

local function parse_winfo(info)
  local prio, enq, deadline, notify, channel =
    string.match(info, '^(%d+):(%d+):(-?%d+):(%d):(.*)$')
  return tonumber(prio), tonumber(enq), tonumber(deadline), notify == '1', channel
end

-- Remove a waiter from every waiter structure; returns its winfo (or false).
local function unqueue(id)
  local info = redis.call('HGET', K_WINFO, id)
  redis.call('ZREM', K_QUEUE, id)
  redis.call('ZREM', K_WEXP, id)
  redis.call('HDEL', K_WINFO, id)
  return info
end

-- A waiter leaves without a grant: count why (its own deadline, or its lease).
local function drop_waiter(id, now)
  local info = unqueue(id)
  if not info then return end
  local _, _, deadline = parse_winfo(info)
  if deadline >= 0 and deadline <= now then
    redis.call('HINCRBY', K_META, 'timeouts', 1)
  else
    redis.call('HINCRBY', K_META, 'lapsed', 1)
  end
end
