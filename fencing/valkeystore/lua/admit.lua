-- admit: check a write's token and raise the high-water mark, atomically.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:state  checkpoint state (its expiry follows the record's)
-- KEYS[3] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> token (decimal string, 1 to 20 digits, no leading zeros)
-- ARGV[2] -> "1" to also require a live lease holding the token, else "0"
-- ARGV[3] -> replication mode (absent means "0"; see valkeystore/wait.go):
--            "0" plain: admit and raise, no confirmation bookkeeping;
--            "1" probe: admit only a token equal to a confirmed mark (hw,
--                the record's "hwc" field, the highest mark a WAIT has
--                confirmed); for a token that would raise hw or equals an
--                unconfirmed hw, return {"WAIT"} and write nothing;
--            "2" write: admit and set hw to the token even when it is equal
--                (so that the replication offset of this connection covers
--                the mark, which is what WAIT counts).
-- ARGV[4] -> the retention in ms ("0" or absent: keep for ever): an
--            admission keeps the record that long past it (fg_keep, with
--            fg_slack: written at most about once per slack)
--
-- Returns one of:
--   {"OK", issued, hw, raised, floor}
--                                admitted; raised is "1" when hw moved up
--                                (modes "0" and "1"; mode "1" never raises)
--   {"OK", issued, hw, raised, confirm, floor}
--                                admitted (mode "2"); confirm is "1" when
--                                the caller must WAIT for replicas before
--                                relying on it (hw was written), "0" when
--                                the mark is already confirmed
--   {"WAIT"}                     (mode "1") rerun in mode "2" on a dedicated
--                                connection and WAIT
--   {"NOTISSUED", issued, floor} token > issued (never handed out)
--   {"STALE", hw}                token < hw
--   {"FLOOR", floor + 1}         token <= floor: the token predates this
--                                record, i.e. the store lost its data since
--                                it was issued (see acquire.lua); no newer
--                                write need have been admitted
--   {"FLOOR", now_us}            no record and token < the server's TIME
--                                in µs: a record created now would start
--                                there (acquire.lua), so the token was
--                                issued before the record was removed
--                                (retention) or lost, or never
--   {"NOTHELD"}                  RequireLive and no live lease with the token
--
-- floor (every OK and NOTISSUED reply ends with it) is the record's floor,
-- "0" for none: it changes only when the record is created or lifted, so a
-- gate that sees it change knows the record was lost (see seen.go).
--
-- Never creates a record: an unknown resource has issued 0, so every token
-- at or above the clock is "not issued" (NOTISSUED, issued and floor "0"),
-- every one below it stale (FLOOR). Idempotent: a retry of an admitted
-- token admits again.
local rec, state, bar = KEYS[1], KEYS[2], KEYS[3]
local t = ARGV[1]
local f = redis.call('HMGET', rec, 'issued', 'hw', 'floor', 'owner', 'token', 'exp', 'rel')
if not f[1] then
  local _, now_us = fg_now()
  local clock = fg_fmt(now_us)
  if fg_cmp(t, clock) < 0 then
    return {'FLOOR', clock}
  end
  return {'NOTISSUED', '0', '0'}
end
local issued, hw, floor = f[1] or '0', f[2] or '0', f[3] or '0'
-- keep applies the retention to an admitted write (see ARGV[4]).
local function keep()
  local now_ms = fg_now()
  local until_ms = 0
  if fg_live(f[4], f[6], f[7], now_ms) then until_ms = tonumber(f[6]) end
  fg_keep(rec, state, bar, ARGV[4], until_ms, now_ms, fg_slack(ARGV[4]))
end
if fg_cmp(t, issued) > 0 then
  return {'NOTISSUED', issued, floor}
end
if fg_cmp(t, hw) < 0 then
  return {'STALE', hw}
end
if fg_cmp(t, floor) <= 0 then
  return {'FLOOR', fg_fmt(tonumber(floor) + 1)}
end
if ARGV[2] == '1' then
  local now_ms = fg_now()
  if not fg_live(f[4], f[6], f[7], now_ms) or f[5] ~= t then
    return {'NOTHELD'}
  end
end
local mode = ARGV[3] or '0'
if mode == '0' then
  local raised = '0'
  if fg_cmp(t, hw) > 0 then
    redis.call('HSET', rec, 'hw', t)
    raised = '1'
  end
  keep()
  return {'OK', issued, t, raised, floor}
end
-- t >= hw here. The mark t is confirmed when hwc >= t (then t == hw).
local hwc = redis.call('HGET', rec, 'hwc') or '0'
if fg_cmp(t, hwc) <= 0 then
  keep()
  if mode == '2' then
    return {'OK', issued, t, '0', '0', floor}
  end
  return {'OK', issued, t, '0', floor}
end
if mode == '1' then
  return {'WAIT'}
end
local raised = '0'
if fg_cmp(t, hw) > 0 then
  raised = '1'
end
-- Written even when equal: an HSET is replicated whether or not the value
-- changes, so the WAIT that follows on this connection covers the mark.
redis.call('HSET', rec, 'hw', t)
keep()
return {'OK', issued, t, raised, '1', floor}
