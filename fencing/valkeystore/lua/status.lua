-- status: read a resource's whole record at the server's current time.
--
-- KEYS[1] -> <prefix>:{R}        record hash
--
-- Returns {now_ms, issued, hw, owner, token, ttl, acq, exp, rel, fin,
--          p_owner, p_token, p_ended, p_fin, cp_token, cp_ms, cp_size}
-- with "" for every absent field (an unknown resource is all "").
--
-- Read-only, idempotent.
local now_ms = fg_now()
local f = redis.call('HMGET', KEYS[1], 'issued', 'hw', 'owner', 'token', 'ttl', 'acq', 'exp', 'rel', 'fin',
  'p_owner', 'p_token', 'p_ended', 'p_fin', 'cp_token', 'cp_ms', 'cp_size')
local out = {fg_fmt(now_ms)}
for i = 1, 16 do out[i + 1] = f[i] or '' end
return out
