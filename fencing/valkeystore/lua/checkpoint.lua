-- checkpoint: save progress state for the live holder and renew its lease
-- by its TTL, in one step.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:live   live-lease index key
-- KEYS[3] -> <prefix>:{R}:state  checkpoint state
-- KEYS[4] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> owner
-- ARGV[2] -> token (decimal string)
-- ARGV[3] -> state (JSON text, size-checked by the caller)
-- ARGV[4] -> the retention in ms ("0": keep for ever; see fg_keep)
--
-- Returns one of:
--   {"OK", "token", t, "ttl_ms", ms, "acquired_ms", ms, "expires_ms", ms}  the renewed lease
--   {"LOST"}                                        not the live holder
--
-- Idempotent: a retry saves the same state again.
local now_ms = fg_now()
local rec, live, state, bar = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local f = fg_holder(rec, ARGV[1], ARGV[2], now_ms)
if not f then
  return {'LOST'}
end
redis.call('SET', state, ARGV[3])
redis.call('HSET', rec, 'cp_token', ARGV[2], 'cp_ms', fg_fmt(now_ms), 'cp_size', tostring(#ARGV[3]))
return fg_extend(rec, live, ARGV[2], f[3], f[4], now_ms, state, bar, ARGV[4])
