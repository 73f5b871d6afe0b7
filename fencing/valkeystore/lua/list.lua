-- list: the live lease of one resource found by List's SCAN of the
-- <prefix>:{*}:live index keys (List runs it once per key found, so that
-- each call touches one cluster slot).
--
-- KEYS[1] -> <prefix>:{R}        record hash
--
-- Returns {"LIVE", "owner", o, "token", t, "ttl_ms", ms, "acquired_ms", ms,
-- "expires_ms", ms} when a lease is live at the server's current time, else
-- {"NONE"}.
--
-- Read-only, idempotent.
local now_ms = fg_now()
local f = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ttl', 'acq', 'exp', 'rel')
if fg_live(f[1], f[5], f[6], now_ms) then
  local r = fg_lease(f[2], f[3], f[4], f[5])
  r[1] = 'LIVE'
  r[#r + 1] = 'owner'
  r[#r + 1] = f[1]
  return r
end
return {'NONE'}
