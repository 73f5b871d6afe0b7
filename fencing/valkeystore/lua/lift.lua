-- lift: move a resource past every token this gate saw, after an admission
-- found its record older than that (the store lost data; see fg_lift).
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:live   live-lease index key
-- KEYS[3] -> <prefix>:{R}:state  checkpoint state (its expiry follows the record's)
-- KEYS[4] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> the token to lift past (decimal string)
-- ARGV[2] -> the retention in ms ("0": keep for ever; see fg_keep)
--
-- Returns {"OK", "issued", t, "floor", f} after the lift.
--
-- Idempotent: lifting twice to the same token changes nothing the second
-- time. Never creates a record's lease.
local now_ms = fg_now()
fg_lift(KEYS[1], KEYS[2], ARGV[1], now_ms)
local f = redis.call('HMGET', KEYS[1], 'issued', 'floor', 'owner', 'exp', 'rel')
local until_ms = 0
if fg_live(f[3], f[4], f[5], now_ms) then until_ms = tonumber(f[4]) end
fg_keep(KEYS[1], KEYS[3], KEYS[4], ARGV[2], until_ms, now_ms, 0)
return {'OK', 'issued', f[1] or '0', 'floor', f[2] or '0'}
