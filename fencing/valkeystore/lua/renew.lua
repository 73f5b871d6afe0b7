-- renew: extend the live lease held by owner with token.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:live   live-lease index key
-- KEYS[3] -> <prefix>:{R}:state  checkpoint state (its expiry follows the record's)
-- KEYS[4] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> owner
-- ARGV[2] -> token (decimal string)
-- ARGV[3] -> new ttl in milliseconds, or "" to keep the lease's TTL
-- ARGV[4] -> the retention in ms ("0": keep for ever; see fg_keep)
--
-- Returns one of:
--   {"OK", "token", t, "ttl_ms", ms, "acquired_ms", ms, "expires_ms", ms}
--   {"LOST"}   not the live holder (wrong owner or token, expired, released)
--
-- Idempotent: running it twice extends from the later server time.
local now_ms = fg_now()
local rec, live = KEYS[1], KEYS[2]
local f = fg_holder(rec, ARGV[1], ARGV[2], now_ms)
if not f then
  return {'LOST'}
end
local ttl = f[3]
if ARGV[3] ~= '' then ttl = ARGV[3] end
return fg_extend(rec, live, ARGV[2], ttl, f[4], now_ms, KEYS[3], KEYS[4], ARGV[4])
