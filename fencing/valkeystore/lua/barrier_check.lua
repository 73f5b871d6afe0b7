-- barrier_check: is a write still behind lower-token entries?
--
-- KEYS[1] -> <prefix>:{R}:bar
-- ARGV[1] -> the write's token
-- ARGV[2] -> the write's own entry (admit_register.lua's member)
--
-- Returns {"BARRIER", "lower", n, "wait_ms", ms, "expired", n}, the values
-- as in admit_register.lua; or {"GONE"} when the write's own entry is no
-- longer there. A waiting write's entry outlives its wait (its deadline is
-- past the barrier timeout, and only its own gate removes it), so a missing
-- one means the server lost the set (FLUSHALL, a restart without
-- persistence, a failover to a replica that missed it): the lower entries
-- it waited for are gone with it, and nothing says they have ended.
if redis.call('ZSCORE', KEYS[1], ARGV[2]) == false then
  return {'GONE'}
end
local live, earliest, expired = fg_lower(KEYS[1], ARGV[1], fg_now())
return {'BARRIER', 'lower', tostring(live), 'wait_ms', fg_fmt(earliest), 'expired', tostring(expired)}
