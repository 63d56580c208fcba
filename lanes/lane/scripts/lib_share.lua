-- lib_share.lua: which waiter a freed slot goes to (the guaranteed share per
-- workflow within a priority, issue 14; seed 001 "share per controller").
--! include queue

-- The workflow after `last` in `names` (sorted), wrapping: round-robin by
-- name, so a workflow that comes or goes does not move where the pass goes on.
local function after(names, last)
  if last then
    for i = 1, #names do
      if names[i] > last then return names[i] end
    end
  end
  return names[1]
end

-- The workflow of a wfq entry ("<p>:<#wf>:<wf>:...").
local function entry_workflow(entry)
  local len, rest = string.match(entry, '^%d+:(%d+):(.*)$')
  return string.sub(rest, 1, tonumber(len))
end

-- Whether two or more workflows wait at priority p: the first and the last
-- wfq entries of p (a workflow's entries are contiguous there) differ.
local function several_wait(p)
  local lo = redis.call('ZRANGEBYLEX', K_WFQ, '[' .. p .. ':', '[' .. p .. ':\255', 'LIMIT', 0, 1)
  if #lo == 0 then return false end
  local hi = redis.call('ZREVRANGEBYLEX', K_WFQ, '[' .. p .. ':\255', '[' .. p .. ':', 'LIMIT', 0, 1)
  return entry_workflow(lo[1]) ~= entry_workflow(hi[1])
end

-- The books of priority p: holders per workflow (meta h:<p>:<wf>) and
-- waiters per workflow (counted in wfq, one jump per workflow).
local function books_of(st, p)
  local held, waiting = {}, {}
  local flat = redis.call('HGETALL', K_META)
  for i = 1, #flat, 2 do
    local fp, wf = string.match(flat[i], '^h:(%d+):(.*)$')
    if fp and tonumber(fp) == p and tonumber(flat[i + 1]) > 0 then held[wf] = tonumber(flat[i + 1]) end
  end
  if st.multi ~= '1' then
    -- One workflow has ever queued here (wf1): every waiter at p is its own.
    local n = redis.call('ZCOUNT', K_QUEUE, fmt(p * PRIO_SPAN), '(' .. fmt((p + 1) * PRIO_SPAN))
    if n > 0 then waiting[st.wf1] = n end
    return held, waiting
  end
  local from, stop = '[' .. p .. ':', '[' .. p .. ':\255'
  while true do
    local first = redis.call('ZRANGEBYLEX', K_WFQ, from, stop, 'LIMIT', 0, 1)
    if #first == 0 then break end
    local wf = entry_workflow(first[1])
    local prefix = p .. ':' .. #wf .. ':' .. wf .. ':'
    waiting[wf] = redis.call('ZLEXCOUNT', K_WFQ, '[' .. prefix, '[' .. prefix .. '\255')
    from = '(' .. prefix .. '\255'
  end
  return held, waiting
end

-- Slots owed to each workflow with work at a priority: max(1, W / number of
-- workflows holding or waiting there), floored.
local function share_of(width, held, waiting)
  local with_work = 0
  for wf, n in pairs(held) do if n > 0 then with_work = with_work + 1 end end
  for wf, n in pairs(waiting) do
    if n > 0 and not (held[wf] and held[wf] > 0) then with_work = with_work + 1 end
  end
  if with_work == 0 then return 0 end
  return math.max(1, math.floor(width / with_work))
end

-- The waiter a free slot goes to: {member, score}, or nil with nobody
-- waiting. Priority first: the queue's head class. Within it, with one
-- workflow waiting, its head (arrival order, as with no workflows); with
-- several, a workflow under its share (round-robin among them, cursor
-- co:<p>), else one lent the slot (round-robin among all that wait, its own
-- cursor cl:<p>: a grant by one pass never moves where the other goes on).
local function next_waiter(st)
  local head = redis.call('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
  if #head == 0 then return nil end
  local score = tonumber(head[2])
  local p = math.floor(score / PRIO_SPAN)
  if st.multi ~= '1' or not several_wait(p) then return head[1], score end
  local held, waiting = books_of(st, p)
  local share = share_of(st.width, held, waiting)
  local owed, any = {}, {}
  for wf, n in pairs(waiting) do
    if n > 0 then
      any[#any + 1] = wf
      if (held[wf] or 0) < share then owed[#owed + 1] = wf end
    end
  end
  table.sort(owed)
  table.sort(any)
  local wf, cursor
  if #owed > 0 then
    cursor = 'co:' .. p
    wf = after(owed, redis.call('HGET', K_SHARES, cursor) or nil)
  else
    cursor = 'cl:' .. p
    wf = after(any, redis.call('HGET', K_SHARES, cursor) or nil)
  end
  local prefix = p .. ':' .. #wf .. ':' .. wf .. ':'
  local first = redis.call('ZRANGEBYLEX', K_WFQ, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', 0, 1)
  if #first == 0 then return head[1], score end   -- books apart from the entries: the head
  local seq, member = string.match(string.sub(first[1], #prefix + 1), '^(%d+):(.*)$')
  local found = tonumber(redis.call('ZSCORE', K_QUEUE, member))
  if not found then
    -- A wfq entry with no queue entry: drop it; the head now.
    redis.call('ZREM', K_WFQ, first[1])
    return head[1], score
  end
  redis.call('HSET', K_SHARES, cursor, wf)
  return member, found
end
