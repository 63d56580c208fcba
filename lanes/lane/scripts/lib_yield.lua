-- lib_yield.lua: preemption of background holders by urgent waiters.
--
-- A lane that is full when an urgent caller (interactive or user tool)
-- queues would admit it only at the next release, up to a whole background
-- call later. Instead the lane asks background holders to give their slots
-- back, one per urgent waiter: it marks the holder (meta y:<id>) and
-- publishes its id alone on its process's wake channel (a grant there is
-- "<id> <epoch> <counter>"; lanes/lane/doorbell.py), unless the caller cuts
-- the holders of its own process from the reply (see ask_yields). The
-- holder aborts its call and releases; the release hands the slot to the
-- head waiter, the urgent one, so the lane never holds more than its
-- width. The holder then
-- queues again at the head of its priority (acquire.lua, fresh '2'), with
-- an id ending in 'y' (lanes/lane/base.py YIELDED_ONCE): such a holder is
-- never asked again, so a background call is cut at most once per
-- admission, however long urgent callers keep coming.
-- A mark goes with its holder (release.lua, lib_hold.lua unhold).
--! include queue

local YIELD_SCAN = 256            -- holder entries looked at per call (bounded work)
-- A holder granted less than this long ago has usually not had its call's
-- answer head yet, and a call is cut only from then on (lanes/routing/
-- backend.py): asking it made the urgent waiter wait for that head, 4-8 ms
-- in 8 % of the priority benchmark's backlog samples (docs/BENCHMARKS_JOURNAL.md,
-- tenth round), against about 1 ms for a holder that can be cut at once.
local YIELD_MIN_AGE_MS = 20

-- Ask as many background holders to yield as urgent waiters wait beyond
-- those already asked: the most recently granted first (the least work
-- lost; the highest counter, as every holder is of the current epoch),
-- those granted YIELD_MIN_AGE_MS ago or earlier before younger ones.
-- Returns the ids asked now (the caller's reply names them: a holder in the
-- caller's own process is cut by the caller at once, lanes/lane/sync.py).
-- own_token: the caller's process token when it cuts its own process's
-- holders from the reply; they get no message then, so that no second
-- thread of that process wakes to act on the same ask (nil: every holder
-- asked gets one). now: the server time in ms, as the caller read it.
local function ask_yields(own_token, now)
  local asked = {}
  local urgent = redis.call('ZCOUNT', K_QUEUE, '-inf', '(' .. fmt(2 * PRIO_SPAN))
  if urgent == 0 then return asked end
  local flat = redis.call('HSCAN', K_HINFO, 0, 'COUNT', YIELD_SCAN)[2]
  local ids, counters, young, fields = {}, {}, {}, {}
  local young_after = now - YIELD_MIN_AGE_MS
  for i = 1, #flat, 2 do
    local counter, granted, prio = string.match(flat[i + 1], '^%d+:(%d+):(%d+):(%d+)')
    if prio == '2' and string.byte(flat[i], -1) ~= 121 then   -- 121: 'y', yielded once
      ids[#ids + 1] = flat[i]
      counters[#counters + 1] = tonumber(counter)
      young[#young + 1] = tonumber(granted) > young_after
      fields[#fields + 1] = 'y:' .. flat[i]
    end
  end
  if #ids == 0 then return asked end
  local marks = redis.call('HMGET', K_META, unpack(fields))
  local free = {}
  local want = urgent
  for i = 1, #ids do
    if marks[i] then want = want - 1 else free[#free + 1] = i end
  end
  if want <= 0 or #free == 0 then return asked end
  table.sort(free, function(a, b)
    if young[a] ~= young[b] then return young[b] end
    return counters[a] > counters[b]
  end)
  for j = 1, math.min(want, #free) do
    local id = ids[free[j]]
    redis.call('HSET', K_META, 'y:' .. id, '1')
    if own_token == nil or token_of(id) ~= own_token then
      redis.call('PUBLISH', channel_of(id), id)
    end
    asked[#asked + 1] = id
  end
  if #asked > 0 then redis.call('HINCRBY', K_META, 'yields', #asked) end
  return asked
end
