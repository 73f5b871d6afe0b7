-- barrier_check: is a write still behind lower-token entries?
--
-- KEYS[1] -> <prefix>:{R}:bar
-- ARGV[1] -> the write's token
--
-- Returns {"BARRIER", "lower", n, "wait_ms", ms, "expired", n}, the values
-- as in admit_register.lua.
local live, earliest, expired = fg_lower(KEYS[1], ARGV[1], fg_now())
return {'BARRIER', 'lower', tostring(live), 'wait_ms', fg_fmt(earliest), 'expired', tostring(expired)}
