-- admit_register: admit a write (admit.lua, mode "0") and, when admitted,
-- register it in the shared barrier, in one atomic step.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:state  checkpoint state: as admit.lua
-- KEYS[3] -> <prefix>:{R}:bar    barrier entries (see barrier_lib.lua); as admit.lua
-- ARGV[1] -> token, ARGV[2] -> "1"/"0" require live: as admit.lua
-- ARGV[3] -> "0" (admit.lua's plain mode)
-- ARGV[4] -> the retention in ms: as admit.lua
-- ARGV[5] -> entry id "<gate id>:<seq>"
-- ARGV[6] -> hold: the entry's lifetime in ms (decimal)
--
-- Returns admit.lua's refusals unchanged (nothing registered), or
--   {"OK", issued, hw, raised, floor, member, lower, wait_ms, expired}
-- member: the registered entry; lower: how many unexpired entries with a
-- lower token exist; wait_ms: ms until the earliest of their deadlines;
-- expired: expired lower entries removed.
local r = fg_admit()
if r[1] ~= 'OK' then
  return r
end
local bar, t, hold = KEYS[3], ARGV[1], tonumber(ARGV[6])
local now_ms = fg_now()
local member = fg_fmt(now_ms + hold) .. '|' .. ARGV[5]
redis.call('ZADD', bar, t, member)
if redis.call('PTTL', bar) < hold then
  redis.call('PEXPIRE', bar, hold)
end
-- A record with a barrier entry is not removed (DESIGN §12): with a
-- retention, the record and its state outlive the entry (fg_keep keeps
-- them so on every later write).
local ret = tonumber(ARGV[4] or '0') or 0
if ret > 0 and redis.call('PTTL', KEYS[1]) < hold then
  redis.call('PEXPIRE', KEYS[1], hold)
  redis.call('PEXPIRE', KEYS[2], hold)
end
local live, earliest, expired = fg_lower(bar, t, now_ms)
return {r[1], r[2], r[3], r[4], r[5], member, tostring(live), fg_fmt(earliest), tostring(expired)}
