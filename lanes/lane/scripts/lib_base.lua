-- lib_base.lua: the key names, constants and clock every lane script uses.
--
-- The helpers live in small lib_*.lua files. An include line ('--!', then
-- 'include a b') in a script or lib file is replaced by lib_a.lua, lib_b.lua and
-- what they include in turn, each file once (lanes/lane/_lua.py). A script includes only
-- what it calls, and the hot scripts include the slow-path helpers only after
-- their fast path: each call of a script runs the top level of everything it
-- includes (a closure per local function), so what is not included costs nothing.
--
-- Every script of a lane takes the same eight KEYS, all sharing one hash tag
-- (one Redis Cluster slot); lanes/lane/keys.py builds them:
--   KEYS[1] meta     hash  width, epoch, counter (last generation), inflight
--                          (holders), seq (last enqueue stamp), quiet_until (ms),
--                          reap_at (ms), returned, timeouts, cancels, expired,
--                          lapsed, hold_ewma_ms, run (run_id of the server
--                          that wrote the state), restarts, repairs, and
--                          h:<p>:<wf> (holders of workflow wf at priority p;
--                          in meta so the hot paths read and write it with
--                          the rest), wf1 (the first workflow that queued),
--                          multi ('1' once another workflow queued too:
--                          from then on every waiter is also in wfq),
--                          y:<id> (background holder id was asked to
--                          yield its slot, lib_yield.lua), yields (asked)
--   KEYS[2] holders  zset  holder id -> lease deadline (ms, Redis server time)
--   KEYS[3] hinfo    hash  holder id -> "epoch:counter:granted_ms:priority"
--   KEYS[4] queue    zset  waiter -> priority * PRIO_SPAN + seq (class, then arrival)
--   KEYS[5] wexp     zset  waiter -> min(waiter lease deadline, wait deadline)
--   KEYS[6] waits    list  recent admission waits "priority:ms", newest first
--   KEYS[7] shares   hash  co:<p> / cl:<p>: the last workflow served at
--                          priority p by the owed / the lending pass (lib_share.lua)
--   KEYS[8] wfq      zset  once meta multi is '1', every waiter again, all scores 0, as
--                          "<p>:<#wf>:<wf>:<seq, 16 digits>:<member>": the
--                          head of one workflow at one priority is one
--                          ZRANGEBYLEX (lib_share.lua)
--
-- A waiter's member (in queue and wexp) is its whole record,
-- "notify:timeout_ms:lease_ms:id[:workflow]" (lease_ms: the waiter's own
-- lease; no workflow part for the anonymous workflow ''), so the head of the
-- queue comes with everything a grant needs. notify 1 = the grant must
-- reach a subscriber or the waiter is dropped; timeout_ms -1 = no wait limit.
-- A holder's hinfo entry is "epoch:counter:granted_ms:priority[:workflow]".
-- seq is the enqueue time in microseconds since the epoch, raised past the
-- previous one when two arrive in the same microsecond: it orders arrivals
-- and dates them (the admission wait of a grant is now - seq).
-- A waiter with id "<token>.<n>" is woken on "<prefix>:wake:<token>", its
-- process's channel (keys.py wake_channel), where a holder asked to yield
-- hears it too (lib_yield.lua).
--
-- Grants counted = counter - returned (a grant taken back, e.g. by a waiter
-- that left in the same instant, bumps 'returned'), so a grant writes one
-- counter. inflight = ZCARD holders, kept in meta so the hot paths read it
-- with the rest of the state. reap_at is a lower bound of every score in
-- holders and wexp (absent = 0), and 0 while the lane is quiet: acquire and
-- release take their fast paths only while now < reap_at; every other
-- script reaps in full and stores the exact bound.
local K_META, K_HOLDERS, K_HINFO, K_QUEUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_WEXP, K_WAITS, K_SHARES, K_WFQ = KEYS[5], KEYS[6], KEYS[7], KEYS[8]

-- The last ARGV of every script: the run_id of the Redis server the caller's
-- connection reached ('' = not known: no check). meta 'run' holds the run_id
-- of the server that wrote the state; a state written by another server
-- process (an older snapshot restored at a restart, AOF's lost last second,
-- a failover to a replica) is not trusted: see lib_state.lua reincarnate.
local RUN = ARGV[#ARGV]

-- 2^51: seq is below it for 71 years of a lane's state, and priority * 2^51
-- + seq stays an exact double for the three priorities (0..2).
local PRIO_SPAN = 2251799813685248
local REAP_MAX = 64               -- expired entries removed per call (bounded work)
local GRANT_MAX = 256             -- grants per call; callers loop on the 'more' flag
local WAITS_KEEP = 512            -- admission-wait samples kept for p50/p95
local WAITS_SLACK = 64            -- the list is trimmed back to WAITS_KEEP past this
local EWMA_ALPHA = 0.1            -- weight of the newest hold time
local NEVER = 9007199254740992    -- 2^53: reap_at when nothing can expire

local function now_us()
  -- Server time: every lease and wait deadline is on one clock (Redis >= 5
  -- replicates script effects, so TIME is allowed before writes).
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

local function fmt(n) return string.format('%d', n) end
