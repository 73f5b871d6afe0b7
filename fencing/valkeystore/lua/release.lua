-- release: compare-and-release the lease held by owner with token.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:live   live-lease index key
-- KEYS[3] -> <prefix>:{R}:state  checkpoint state (its expiry follows the record's)
-- KEYS[4] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> owner
-- ARGV[2] -> token (decimal string)
-- ARGV[3] -> "1" when the holder finished the work, else "0"
-- ARGV[4] -> the retention in ms ("0": keep for ever; see fg_keep): the
--            record expires that long after the release
--
-- Returns one of:
--   {"OK", "released", "1"}  the live lease ended now (issued and hw are kept)
--   {"OK", "released", "0"}  that lease had already ended and no newer token
--                            was issued
--   {"LOST"}                 another owner or a newer token
--
-- Not retried by the client: a retry after a lost reply answers "0".
local now_ms = fg_now()
local rec, live = KEYS[1], KEYS[2]
local f = redis.call('HMGET', rec, 'owner', 'token', 'exp', 'rel', 'issued')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then
  return {'LOST'}
end
if fg_live(f[1], f[3], f[4], now_ms) then
  redis.call('HSET', rec, 'rel', '1', 'fin', ARGV[3], 'exp', fg_fmt(now_ms))
  redis.call('DEL', live)
  fg_keep(KEYS[1], KEYS[3], KEYS[4], ARGV[4], 0, now_ms, 0)
  return {'OK', 'released', '1'}
end
if f[5] == ARGV[2] then
  return {'OK', 'released', '0'}
end
return {'LOST'}
