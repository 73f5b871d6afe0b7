-- barrier_check: is a write still behind lower-token entries?
--
-- KEYS[1] -> <prefix>:{R}:bar
-- ARGV[1] -> the write's token
--
-- Returns {lower, wait_ms, expired} as admit_register.lua.
local live, earliest, expired = fg_lower(KEYS[1], ARGV[1], fg_now())
return {tostring(live), fg_fmt(earliest), tostring(expired)}
