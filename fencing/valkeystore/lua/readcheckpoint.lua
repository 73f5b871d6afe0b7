-- readcheckpoint: read the last checkpoint state with the record.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:state  checkpoint state
--
-- Returns status.lua's reply followed by "state", the state ("" when none).
-- A checkpoint exists when cp_token is set and the state key holds a
-- non-empty string. Metadata whose state key is gone (deleted outside
-- fencegate) is reported as no checkpoint: cp_token, cp_ms and cp_size are
-- "" and so is the state, the same answer status.lua gives (see fg_record).
-- The caller therefore never receives checkpoint metadata with an empty
-- state; it also checks that the state is valid JSON.
--
-- Read-only, idempotent.
local out, has_cp = fg_record(KEYS[1], KEYS[2])
local state = ''
if has_cp then
  state = redis.call('GET', KEYS[2])
end
out[#out + 1] = 'state'
out[#out + 1] = state
return out
