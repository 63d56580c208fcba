-- lib_reap.lua: removal of expired holder leases and lapsed waiters.
--! include hold queue

-- Expired holder leases and lapsed waiters go first, a bounded number per
-- call; then reap_at is set to the earliest score left.
local function reap(st, now)
  local gone = redis.call('ZRANGEBYSCORE', K_HOLDERS, '-inf', now, 'LIMIT', 0, REAP_MAX)
  for i = 1, #gone do unhold(st, gone[i], now, nil) end
  if #gone > 0 then redis.call('HINCRBY', K_META, 'expired', #gone) end
  local lapsed = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, REAP_MAX)
  for i = 1, #lapsed do drop_waiter(st, lapsed[i], now) end
  -- inflight must equal the holder entries after every script. If it does
  -- not (a holder set evicted under a maxmemory policy, or a count written
  -- by an older script that was run twice), the entries are the truth:
  -- repair the count and record it ('repairs', shown by stats).
  local holding = redis.call('ZCARD', K_HOLDERS)
  if holding ~= st.inflight then
    st.inflight = holding
    redis.call('HSET', K_META, 'inflight', holding)
    redis.call('HINCRBY', K_META, 'repairs', 1)
    -- The holder counts per workflow follow the entries too: recounted.
    local fields = redis.call('HKEYS', K_META)
    for i = 1, #fields do
      if string.sub(fields[i], 1, 2) == 'h:' then redis.call('HDEL', K_META, fields[i]) end
    end
    local ids = redis.call('ZRANGE', K_HOLDERS, 0, -1)
    for i = 1, #ids do
      local info = redis.call('HGET', K_HINFO, ids[i])
      if info then
        local _, _, _, prio, wf = parse_hinfo(info)
        note_holding(prio, wf, 1)
      end
    end
  end
  local next_at = NEVER
  local h = redis.call('ZRANGE', K_HOLDERS, 0, 0, 'WITHSCORES')
  if #h == 2 then next_at = tonumber(h[2]) end
  local w = redis.call('ZRANGE', K_WEXP, 0, 0, 'WITHSCORES')
  if #w == 2 and tonumber(w[2]) < next_at then next_at = tonumber(w[2]) end
  -- While quiet, 0: the hot paths, which run only while now < reap_at, then
  -- always take the slow path, which knows about the quiet period.
  if now < st.quiet_until then next_at = 0 end
  if next_at ~= st.reap_at then
    st.reap_at = next_at
    redis.call('HSET', K_META, 'reap_at', fmt(next_at))
  end
end

-- The hot paths' reap: nothing to do until the earliest deadline has passed.
local function reap_due(st, now)
  if now >= st.reap_at then reap(st, now) end
end
