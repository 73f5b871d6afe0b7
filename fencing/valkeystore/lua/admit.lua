-- admit: check a write's token and raise the high-water mark, atomically.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- ARGV[1] -> token (decimal string, 1 to 20 digits, no leading zeros)
-- ARGV[2] -> "1" to also require a live lease holding the token, else "0"
--
-- Returns one of:
--   {"OK", issued, hw, raised}   admitted; raised is "1" when hw moved up
--   {"NOTISSUED", issued}        token > issued (never handed out)
--   {"STALE", mark}              token < hw (mark = hw), or token <= floor
--                                (mark = floor + 1): the token predates this
--                                record, i.e. the store lost its data since
--                                it was issued (see acquire.lua)
--   {"NOTHELD"}                  RequireLive and no live lease with the token
--
-- Never creates a record: an unknown resource has issued 0, so every token
-- is "not issued". Idempotent: a retry of an admitted token admits again.
local rec = KEYS[1]
local t = ARGV[1]
local f = redis.call('HMGET', rec, 'issued', 'hw', 'floor', 'owner', 'token', 'exp', 'rel')
local issued, hw, floor = f[1] or '0', f[2] or '0', f[3] or '0'
if fg_cmp(t, issued) > 0 then
  return {'NOTISSUED', issued}
end
if fg_cmp(t, hw) < 0 then
  return {'STALE', hw}
end
if fg_cmp(t, floor) <= 0 then
  return {'STALE', fg_fmt(tonumber(floor) + 1)}
end
if ARGV[2] == '1' then
  local now_ms = fg_now()
  if not fg_live(f[4], f[6], f[7], now_ms) or f[5] ~= t then
    return {'NOTHELD'}
  end
end
local raised = '0'
if fg_cmp(t, hw) > 0 then
  redis.call('HSET', rec, 'hw', t)
  raised = '1'
end
return {'OK', issued, t, raised}
