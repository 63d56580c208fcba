-- peek.lua: read the lane's statistics (and reap, so counts are current).
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] lease_ms  the caller's lease (the quiet period if the state must start over)
-- ARGV[2] samples   1 = include the admission-wait samples (stats), 0 = not
--                   (forecast: O(log n), no list read)
-- ARGV[3] run       run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- Returns {} when the lane has no state, else
--   {width, in_flight, queued_0, queued_1, queued_2, hold_ewma_ms or '',
--    measured (1 once a hold was timed), grants, timeouts, cancels, expired, lapsed, epoch, quiet_ms,
--    repairs (times inflight was found apart from the holder entries and repaired),
--    k, k workflow entries "priority:in_flight:waiting:owed:workflow" (stats only;
--    k = 0 for a forecast), samples...}
--! include reap handoff
local lease_ms = tonumber(ARGV[1])
local now = now_ms()
local st = load_state(now, '', lease_ms)
if not st then return {} end
reap(st, now)
grant_free(st, now)
local m = redis.call('HMGET', K_META, 'hold_ewma_ms', 'counter', 'timeouts', 'cancels', 'expired',
  'lapsed', 'returned')
-- grants = generations handed out minus grants taken back (see lib_base.lua)
m[2] = (tonumber(m[2]) or 0) - (tonumber(m[7]) or 0)
local out = {st.width, redis.call('ZCARD', K_HOLDERS)}
for p = 0, 2 do
  -- ZCOUNT is O(log n): the score ranges of one priority class.
  out[#out + 1] = redis.call('ZCOUNT', K_QUEUE, fmt(p * PRIO_SPAN), '(' .. fmt((p + 1) * PRIO_SPAN))
end
out[#out + 1] = m[1] or ''
out[#out + 1] = m[1] and 1 or 0
for i = 2, 6 do out[#out + 1] = tonumber(m[i]) or 0 end
out[#out + 1] = fmt(st.epoch)
local quiet = st.quiet_until - now
if quiet < 0 then quiet = 0 end
out[#out + 1] = quiet
out[#out + 1] = tonumber(redis.call('HGET', K_META, 'repairs')) or 0
local books = {}
if ARGV[2] == '1' then
  for p = 0, 2 do
    local held, waiting = books_of(st, p)
    local share = share_of(st.width, held, waiting)
    local names, seen = {}, {}
    for wf, n in pairs(held) do if n > 0 and not seen[wf] then seen[wf] = true; names[#names + 1] = wf end end
    for wf, n in pairs(waiting) do if n > 0 and not seen[wf] then seen[wf] = true; names[#names + 1] = wf end end
    table.sort(names)
    for _, wf in ipairs(names) do
      local h, w = math.max(0, held[wf] or 0), math.max(0, waiting[wf] or 0)
      -- Owed: slots still due to a workflow that waits, under its share.
      local owed = 0
      if w > 0 and h < share then owed = share - h end
      books[#books + 1] = p .. ':' .. h .. ':' .. w .. ':' .. owed .. ':' .. wf
    end
  end
end
out[#out + 1] = #books
for i = 1, #books do out[#out + 1] = books[i] end
if ARGV[2] == '1' then
  local samples = redis.call('LRANGE', K_WAITS, 0, WAITS_KEEP - 1)
  for i = 1, #samples do out[#out + 1] = samples[i] end
end
return out
