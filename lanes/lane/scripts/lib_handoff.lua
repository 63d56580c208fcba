-- lib_handoff.lua: direct handoff of free slots to head waiters.
--! include hold share

-- Direct handoff: give free slots to waiters (the one lib_share.lua's
-- next_waiter names each time), waking exactly each one through its
-- process's channel. The grant itself lives in hinfo (the waiter's mailbox);
-- the message is only the doorbell, and a waiter whose doorbell is lost finds
-- the grant at its next renewal.
-- Returns true when slots and waiters remain after GRANT_MAX steps.
local function grant_free(st, now)
  if now < st.quiet_until then return false end
  local steps = 0
  while st.width - st.inflight > 0 and steps < GRANT_MAX do
    steps = steps + 1
    local member, score = next_waiter(st)
    if not member then return false end
    local exp = tonumber(redis.call('ZSCORE', K_WEXP, member))
    if exp == nil or exp <= now then
      drop_waiter(st, member, now)
    else
      local wf = queue_remove(st, member, score)
      -- The waiter's own lease, not the caller's: with two lease settings
      -- on one lane, a holder's lease is always the one it renews by.
      local notify, _, id, own_lease = parse_waiter(member)
      local prio = math.floor(score / PRIO_SPAN)
      local counter = grant(st, id, prio, now, own_lease, wf)
      local heard = redis.call('PUBLISH', channel_of(id),
        id .. ' ' .. fmt(st.epoch) .. ' ' .. fmt(counter))
      if notify == '1' and heard == 0 then
        -- Nobody listens for this waiter: its process is gone. Take the
        -- slot back at once rather than strand it for a lease period.
        unhold(st, id, now, nil)
        redis.call('HINCRBY', K_META, 'returned', 1)
        redis.call('HINCRBY', K_META, 'lapsed', 1)
      else
        record_wait(prio, now - enqueued_ms(st, score))
      end
    end
  end
  return st.width - st.inflight > 0 and redis.call('ZCARD', K_QUEUE) > 0
end

-- Milliseconds until the next thing that may free a slot without anyone
-- acting: the earliest holder lease expiry, or the end of a quiet period.
-- -1 when there is none. Waiters' processes wake then to reap and hand off.
local function next_event(st, now)
  local best = -1
  local first = redis.call('ZRANGE', K_HOLDERS, 0, 0, 'WITHSCORES')
  -- An entry already past its lease (more expired than one reap removes)
  -- is due now: 1 ms, never a negative time nobody would wake for.
  if #first == 2 then best = math.max(1, tonumber(first[2]) - now + 1) end
  if st.quiet_until > now and (best < 0 or st.quiet_until - now < best) then
    best = st.quiet_until - now
  end
  if best >= 0 and best < 1 then best = 1 end
  return best
end
