-- readcheckpoint: read the last checkpoint state with the record.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:state  checkpoint state
--
-- Returns the 17 fields of status.lua followed by the state ("" when none).
--
-- Read-only, idempotent.
local now_ms = fg_now()
local f = redis.call('HMGET', KEYS[1], 'issued', 'hw', 'owner', 'token', 'ttl', 'acq', 'exp', 'rel', 'fin',
  'p_owner', 'p_token', 'p_ended', 'p_fin', 'cp_token', 'cp_ms', 'cp_size')
local out = {fg_fmt(now_ms)}
for i = 1, 16 do out[i + 1] = f[i] or '' end
out[18] = redis.call('GET', KEYS[2]) or ''
return out
