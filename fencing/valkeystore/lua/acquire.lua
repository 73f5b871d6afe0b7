-- acquire: take or extend the lease on one resource.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- KEYS[2] -> <prefix>:{R}:live   live-lease index key
-- KEYS[3] -> <prefix>:{R}:state  checkpoint state (its expiry follows the record's)
-- KEYS[4] -> <prefix>:{R}:bar    shared-barrier entries (only their TTL is read; see fg_keep)
-- ARGV[1] -> owner
-- ARGV[2] -> ttl in milliseconds (validated by the caller)
-- ARGV[3] -> the gate's floor hint (decimal token string, "0" for none):
--            the highest token this gate has seen the store issue or
--            admit, on any resource
-- ARGV[4] -> the highest issued token this gate has seen for this resource
--            ("0" for none)
-- ARGV[5] -> the floor this gate saw on this resource's record ("" if it
--            saw none)
-- ARGV[6] -> the retention in ms ("0": keep for ever; see fg_keep)
--
-- Returns one of (named replies, see lib.lua):
--   {"OK", "token", t, "ttl_ms", ms, "acquired_ms", ms, "expires_ms", ms,
--    "floor", f}      new lease, or the same owner's live lease extended;
--                     floor: the record's floor
--   {"HELD", "holder", owner, "expires_ms", ms, "now_ms", ms}
--                     another owner's live lease (now_ms: the server's clock)
--
-- Token rule (store-loss safety): a new token is max(issued + 1, now_us),
-- now_us being the server's TIME in microseconds. Tokens therefore follow
-- the server clock, and a record that lost its recent writes (restart
-- without persistence, FLUSHALL, failover to a lagging or empty replica)
-- still issues tokens above every token issued before the loss, as long as
-- the clock of the node serving now is not behind the issue time of the
-- lost tokens. A record created here (never used, or lost whole) gets
-- floor = max(now_us - 1, ARGV[3]), and the first token floor + 1:
-- admit.lua refuses every token <= floor, so a token from before the loss
-- of the whole record is never admitted, even one issued by a node whose
-- clock was ahead, as long as this gate saw a token at or above it. A
-- record whose issued counter is below ARGV[4] lost writes (rolled back);
-- it is first lifted past ARGV[3] (fg_lift) the same way, and so is one
-- whose floor is not ARGV[5] (it was lost and re-created since this gate
-- saw it). A record whose floor is another one but at or above ARGV[4] was
-- re-created (after retention removed it, or a loss) above every token this
-- gate saw on it: it is not lifted, nothing it saw can be admitted.
--
-- NOT idempotent (issues a token): the client never retries it.
local now_ms, now_us = fg_now()
local rec, live, state, bar = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local hint, seen, seen_floor, ret = ARGV[3] or '0', ARGV[4] or '0', ARGV[5] or '', ARGV[6] or '0'
local before = redis.call('HMGET', rec, 'issued', 'floor')
if before[1] then
  local fl = before[2] or '0'
  local refloored = seen_floor ~= '' and fl ~= seen_floor
  if (not refloored and fg_cmp(before[1], seen) < 0) or (refloored and fg_cmp(fl, seen) < 0) then
    fg_lift(rec, live, fg_max(hint, seen), now_ms)
  end
end
local f = redis.call('HMGET', rec, 'issued', 'owner', 'token', 'ttl', 'acq', 'exp', 'rel', 'fin')
local issued = f[1]
if issued then
  local cur, tok, acq, exp, rel, fin = f[2], f[3], f[5], f[6], f[7], f[8]
  if fg_live(cur, exp, rel, now_ms) then
    if cur ~= owner then
      return {'HELD', 'holder', cur, 'expires_ms', exp, 'now_ms', fg_fmt(now_ms)}
    end
    local r = fg_extend(rec, live, tok, ARGV[2], acq, now_ms, state, bar, ret)
    r[#r + 1] = 'floor'
    r[#r + 1] = redis.call('HGET', rec, 'floor') or '0'
    return r
  end
  if cur then
    local ended = 'expired'
    if rel == '1' then ended = 'released' end
    redis.call('HSET', rec, 'p_owner', cur, 'p_token', tok, 'p_ended', ended, 'p_fin', fin or '0')
  end
else
  local floor = fg_max(fg_fmt(now_us - 1), hint)
  redis.call('HSET', rec, 'issued', floor, 'floor', floor)
  issued = floor
end
local token = fg_fmt(now_us)
if fg_cmp(token, issued) > 0 then
  redis.call('HSET', rec, 'issued', token)
else
  -- The server clock is behind the counter (it stepped back): count on.
  redis.call('HINCRBY', rec, 'issued', 1)
  token = redis.call('HGET', rec, 'issued')
end
local acq, exp = fg_fmt(now_ms), fg_fmt(now_ms + ttl)
redis.call('HSET', rec, 'owner', owner, 'token', token, 'ttl', ARGV[2], 'acq', acq, 'exp', exp, 'rel', '0', 'fin', '0')
redis.call('SET', live, token, 'PXAT', exp)
fg_keep(rec, state, bar, ret, tonumber(exp), now_ms, 0)
local r = fg_lease(token, ARGV[2], acq, exp)
r[#r + 1] = 'floor'
r[#r + 1] = redis.call('HGET', rec, 'floor') or '0'
return r
