-- status: read a resource's whole record at the server's current time.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:state  checkpoint state (only its presence is read)
--
-- Returns {"RECORD", "now_ms", ms, name, value, ...} for the record fields
-- issued, hw, owner, token, ttl, acq, exp, rel, fin, p_owner, p_token,
-- p_ended, p_fin, cp_token, cp_ms, cp_size (lib.lua, fg_record), "" for
-- every absent field (an unknown resource is all ""). The
-- checkpoint fields are "" when the state key is missing or empty, exactly
-- as readcheckpoint.lua reports "no checkpoint" then (see fg_record).
--
-- Read-only, idempotent.
local out = fg_record(KEYS[1], KEYS[2])
return out
