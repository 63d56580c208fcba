-- acquire.lua: grant at once, or join the queue (or, with try_only, refuse).
-- KEYS: the eight lane keys (see lib_base.lua).
-- ARGV[1] id           waiter/holder id "<process token>.<n>" (unique per acquisition)
-- ARGV[2] priority     0 interactive, 1 user tool, 2 background
-- ARGV[3] timeout_ms   wait budget; -1 = no limit (the waiter lease still applies)
-- ARGV[4] lease_ms     holder lease, and waiter lease until the first renewal
-- ARGV[5] width        owner's width if the state must be recreated; '' = ask
-- ARGV[6] try_only     1 = never queue
-- ARGV[7] notify       1 = drop this waiter if a grant finds nobody listening
-- ARGV[8] fresh        1 = first call with this id (its previous entry is not
--                      looked for); 0 = a rejoin; 2 = a first call by a
--                      holder that yielded its slot (lib_yield.lua): it
--                      queues ahead of every waiter of its priority
-- ARGV[9] previous     0 only: the member of this id's earlier queue entry
--                      ('' = none), removed so a rejoin makes no second entry
-- ARGV[10] workflow    the caller's workflow ('' = the anonymous one): its
--                      share within the priority (lib_share.lua)
-- ARGV[11] cuts_own    1 = the caller cuts the holders of its own process
--                      that the reply names as asked (lib_yield.lua): they
--                      get no message on the wake channel
-- ARGV[12] run         run_id of the server the caller reached ('' = unknown; lib_base.lua)
-- A queued waiter's member is ARGV[7]:ARGV[3]:ARGV[4]:ARGV[1][:ARGV[10]]
-- (notify, timeout, its own lease, id, workflow if any): the lease travels
-- with the entry, so a slot handed to this waiter gets the waiter's lease,
-- whoever hands it over.
-- Idempotent: a call for an id that already holds or waits (a call re-sent
-- after its reply was lost) answers with that state and changes nothing.
-- Returns one of:
--   {'granted', epoch, counter}
--   {'queued', epoch, next_event_ms, asked...}   wait for the doorbell on the
--                                      wake channel; asked: the background holders
--                                      this call asked to yield (lib_yield.lua)
--   {'busy', epoch}                    try_only and no free slot
--   {'nostate'}                        state absent and width unknown
--! include base
local id, prio, timeout_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms, wf = tonumber(ARGV[4]), ARGV[10]
local us = now_us()
local now = math.floor(us / 1000)

-- Fast path (the common uncontended call): a fresh id, state present,
-- nothing due for reaping (so not quiet: reap_at is 0 then), nobody queued
-- and a slot free. Inline, with
-- no helper beyond lib_base, so it creates no closure and no table of its own.
if ARGV[8] == '1' then
  -- hfield: this workflow's holder count at this priority (lib_hold.lua note_holding).
  local hfield = 'h:' .. ARGV[2] .. ':' .. wf
  local m = redis.call('HMGET', K_META, 'width', 'epoch', 'reap_at', 'counter', 'inflight', 'run', hfield)
  local reap_at = tonumber(m[3])
  local inflight = tonumber(m[5])
  -- Only on a state this server process wrote (RUN, lib_base.lua).
  if m[1] and reap_at and inflight and now < reap_at and (m[6] == RUN or RUN == '')
      and inflight < tonumber(m[1]) and redis.call('ZCARD', K_QUEUE) == 0 then
    local counter = tonumber(m[4]) + 1
    local deadline = now + lease_ms
    -- NX: a call re-sent after its reply was lost finds its own entry and
    -- changes nothing (inflight counts only entries really added).
    if redis.call('ZADD', K_HOLDERS, 'NX', deadline, id) == 1 then
      -- now, counter and deadline are below 10^14: '..' writes them exactly.
      local held = (tonumber(m[7]) or 0) + 1
      if deadline < reap_at then
        redis.call('HSET', K_META, 'counter', counter, 'inflight', inflight + 1, hfield, held, 'reap_at', deadline)
      else
        redis.call('HSET', K_META, 'counter', counter, 'inflight', inflight + 1, hfield, held)
      end
      local info = m[2] .. ':' .. counter .. ':' .. now .. ':' .. ARGV[2]
      if wf ~= '' then info = info .. ':' .. wf end
      redis.call('HSET', K_HINFO, id, info)
      if redis.call('LPUSH', K_WAITS, ARGV[2] .. ':0') > WAITS_KEEP + WAITS_SLACK then
        redis.call('LTRIM', K_WAITS, 0, WAITS_KEEP - 1)
      end
      return {'granted', m[2], counter}
    end
    local held = redis.call('HGET', K_HINFO, id)
    if held then
      return {'granted', string.match(held, '^(%d+):(%d+):')}
    end
  end
end

--! include reap handoff yield
local st = load_state(now, ARGV[5], lease_ms)
if not st then return {'nostate'} end
reap_due(st, now)
local queued = redis.call('ZCARD', K_QUEUE)
if queued > 0 then
  grant_free(st, now)
  queued = redis.call('ZCARD', K_QUEUE)
end

-- A repeated call with the same id (a call re-sent after its reply was
-- lost, fresh or not, or a waiter rejoining after its place lapsed) must not
-- make a second entry or a second holder: it answers with what the id has.
local held = redis.call('HGET', K_HINFO, id)
if held then
  local epoch, counter = parse_hinfo(held)
  return {'granted', epoch, counter}
end
local member = ARGV[7] .. ':' .. ARGV[3] .. ':' .. ARGV[4] .. ':' .. id
if wf ~= '' then member = member .. ':' .. wf end
if ARGV[8] ~= '1' and ARGV[9] and ARGV[9] ~= '' and ARGV[9] ~= member then
  local old = tonumber(redis.call('ZSCORE', K_QUEUE, ARGV[9]))
  if old then
    queue_remove(st, ARGV[9], old)
    queued = queued - 1
  end
end
if redis.call('ZSCORE', K_QUEUE, member) then
  return {'queued', fmt(st.epoch), next_event(st, now)}
end

if now >= st.quiet_until and queued == 0 and st.inflight < st.width then
  local counter = grant(st, id, prio, now, lease_ms, wf)
  record_wait(prio, 0)
  return {'granted', fmt(st.epoch), fmt(counter)}
end
if ARGV[6] == '1' then return {'busy', fmt(st.epoch)} end

-- The enqueue stamp: microseconds since the epoch, past the last one; for a
-- holder that yielded, just before the first waiter of its priority (it was
-- served before all of them), and then meta seq stays.
local seq = us - st.epoch * 1000
local first = {}
if ARGV[8] == '2' then
  first = redis.call('ZRANGEBYSCORE', K_QUEUE, fmt(prio * PRIO_SPAN), '(' .. fmt((prio + 1) * PRIO_SPAN),
    'WITHSCORES', 'LIMIT', 0, 1)
end
if #first == 2 and tonumber(first[2]) % PRIO_SPAN > 1 then
  seq = tonumber(first[2]) % PRIO_SPAN - 1
else
  local last = tonumber(redis.call('HGET', K_META, 'seq')) or 0
  if seq <= last then seq = last + 1 end
  redis.call('HSET', K_META, 'seq', fmt(seq))
end
local wexp = now + lease_ms
if timeout_ms >= 0 and now + timeout_ms < wexp then wexp = now + timeout_ms end
queue_add(st, member, prio, seq, wexp)
lower_reap_at(st, wexp)
-- An urgent caller queued on a full lane: background holders give way.
local reply = {'queued', fmt(st.epoch), next_event(st, now)}
if prio < 2 and now >= st.quiet_until then
  local own_token = nil
  if ARGV[11] == '1' then own_token = token_of(id) end
  for _, asked in ipairs(ask_yields(own_token, now)) do reply[#reply + 1] = asked end
end
return reply
