-- fencegate: helpers prepended to every script (see scripts.go).
--
-- Conventions shared by all scripts:
--   * A resource R has these keys, all hash-tagged with {R} so that every
--     script touches a single cluster slot:
--       <prefix>:{R}        hash: the record; with a retention it expires
--                           `retention` after its last change or the end
--                           of its live lease, whichever is later (fg_keep)
--       <prefix>:{R}:state  string: the last checkpoint state, expiring
--                           with the record
--       <prefix>:{R}:live   string: the live lease's token, expiring with
--                           the lease (PXAT); an index used only by List
--       <prefix>:{R}:bar    sorted set: the shared barrier's entries (see
--                           barrier_lib.lua); fg_keep reads its TTL
--   * Every key a script touches comes from its KEYS, never from a name
--     built here (Valkey and Redis Cluster, their proxies and tooling
--     require a script to declare the keys it accesses): the helpers take
--     the keys from their caller, and each script's header lists its KEYS.
--   * Record fields: issued, hw, floor, hwc (tokens, decimal strings; hwc,
--     the highest mark a WAIT confirmed, only with WaitReplicas); owner,
--     token, ttl (ms), acq, exp (server ms), rel, fin ("1"/"0") for the most
--     recent lease; p_owner, p_token, p_ended, p_fin for the lease before
--     it; cp_token, cp_ms, cp_size for the checkpoint.
--   * Tokens are decimal strings without leading zeros and are compared as
--     strings (length first), never as Lua numbers: Lua numbers are doubles
--     and a forged token may exceed 2^53.
--   * Time comes from the server's TIME, never from the caller.
--   * Replies are decoded by name (see reply.go): a reply is a kind ("OK",
--     "LOST", ...) followed by name/value pairs, e.g. {"OK", "token", t,
--     "ttl_ms", ttl, ...}; the order of the pairs carries no meaning. The
--     hot admission replies (admit.lua, admit_register.lua) stay
--     positional, with their order documented in their headers and one
--     typed decoder each.

-- fg_now returns the server time in milliseconds and in microseconds.
local function fg_now()
  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  return sec * 1000 + math.floor(usec / 1000), sec * 1000000 + usec
end

-- fg_fmt renders an integral Lua number without exponent (exact below 2^53).
local function fg_fmt(n)
  return string.format('%.0f', n)
end

-- fg_cmp compares two decimal token strings: -1, 0 or 1.
local function fg_cmp(a, b)
  if #a ~= #b then
    if #a < #b then return -1 end
    return 1
  end
  if a == b then return 0 end
  if a < b then return -1 end
  return 1
end

-- fg_live reports whether the most recent lease (owner, exp, rel) is live.
local function fg_live(owner, exp, rel, now_ms)
  return owner and owner ~= '' and rel ~= '1' and now_ms < tonumber(exp)
end

-- fg_holder returns the most recent lease's fields {owner, token, ttl, acq,
-- exp, rel} when that lease is live and held by owner with token, else nil.
local function fg_holder(rec, owner, token, now_ms)
  local f = redis.call('HMGET', rec, 'owner', 'token', 'ttl', 'acq', 'exp', 'rel')
  if fg_live(f[1], f[5], f[6], now_ms) and f[1] == owner and f[2] == token then
    return f
  end
  return nil
end

-- fg_lease is the named lease reply {"OK", "token", token, "ttl_ms", ttl,
-- "acquired_ms", acq, "expires_ms", exp} (see reply.go, leaseFields).
local function fg_lease(token, ttl, acq, exp)
  return {'OK', 'token', token, 'ttl_ms', ttl, 'acquired_ms', acq, 'expires_ms', exp}
end

-- fg_extend sets the live lease's ttl (ms, a decimal string) and its expiry
-- to now_ms + ttl, moves the live-lease index key's expiry with it, and
-- returns the lease reply (fg_lease). It is defined after fg_keep, which
-- it calls with state, bar and ret (the record and state then expire ret
-- after the lease).

-- fg_has_state reports whether the checkpoint state key holds a state: a
-- non-empty string (a checkpoint's state is JSON, never empty).
local function fg_has_state(state)
  local t = redis.call('TYPE', state)
  if type(t) == 'table' then t = t['ok'] end
  return t == 'string' and redis.call('STRLEN', state) > 0
end

-- fg_record_fields are the record fields fg_record reads, named in its
-- reply as in the hash.
local fg_record_fields = {'issued', 'hw', 'owner', 'token', 'ttl', 'acq', 'exp', 'rel', 'fin',
  'p_owner', 'p_token', 'p_ended', 'p_fin', 'cp_token', 'cp_ms', 'cp_size'}

-- fg_record reads a resource's record for status.lua and readcheckpoint.lua:
-- {"RECORD", "now_ms", now_ms, name, value, ...} for every name of
-- fg_record_fields, "" for every absent field, and whether a checkpoint
-- exists. The checkpoint fields are "" unless the state key holds a state,
-- so that metadata whose state is gone (deleted outside fencegate) never
-- announces a checkpoint that cannot be read.
local function fg_record(rec, state)
  local now_ms = fg_now()
  local f = redis.call('HMGET', rec, unpack(fg_record_fields))
  local has_cp = f[14] and f[14] ~= '' and fg_has_state(state)
  local out = {'RECORD', 'now_ms', fg_fmt(now_ms)}
  for i, name in ipairs(fg_record_fields) do
    local v = f[i] or ''
    if i >= 14 and not has_cp then v = '' end
    out[#out + 1] = name
    out[#out + 1] = v
  end
  return out, has_cp
end

-- fg_max returns the greater of two decimal token strings.
local function fg_max(a, b)
  if fg_cmp(a, b) < 0 then return b end
  return a
end

-- fg_lift moves a record past `to` (a decimal token string), after the
-- caller found it older than tokens already seen (the store lost data):
-- floor and issued rise to at least `to`, so every token up to `to` is
-- refused and the next token is above it, and a live lease whose token is
-- at or below `to` ends now (its holder must acquire again).
local function fg_lift(rec, live, to, now_ms)
  local f = redis.call('HMGET', rec, 'issued', 'floor', 'owner', 'token', 'exp', 'rel')
  if fg_cmp(f[2] or '0', to) < 0 then redis.call('HSET', rec, 'floor', to) end
  if fg_cmp(f[1] or '0', to) < 0 then redis.call('HSET', rec, 'issued', to) end
  if fg_live(f[3], f[5], f[6], now_ms) and fg_cmp(f[4], to) <= 0 then
    redis.call('HSET', rec, 'exp', fg_fmt(now_ms))
    redis.call('DEL', live)
  end
end

-- fg_keep applies the retention (DESIGN §12) after a script wrote to or
-- admitted on a record: the record hash and its checkpoint state expire
-- ret ms (a decimal string) after the later of now and until_ms (the live
-- lease's expiry, 0 when there is none), and not before the record's
-- shared-barrier entries (bar, the record's <prefix>:{R}:bar, which the
-- caller passes in its KEYS: its TTL is read). ret "0" (or absent) keeps them
-- forever: a TTL left by an earlier retention is removed. The TTL is
-- written only when it is off by more than slack ms (0: always), so that
-- admissions at the mark, on the hot path, write at most about once per
-- slack. Nothing is done for a record that does not exist.
local function fg_keep(rec, state, bar, ret, until_ms, now_ms, slack)
  local r = tonumber(ret or '0') or 0
  local cur = redis.call('PTTL', rec)
  if cur == -2 then return end
  if r <= 0 then
    if cur >= 0 then
      redis.call('PERSIST', rec)
      if state then redis.call('PERSIST', state) end
    end
    return
  end
  -- A record with a shared-barrier entry is not removed either: its
  -- entries' set (bar) expires with the last entry's deadline.
  local want = math.max(r + math.max(until_ms - now_ms, 0), redis.call('PTTL', bar))
  -- With slack 0 (a write: a checkpoint's SET just took the state's TTL
  -- away) the TTLs are always written, even when the record's is right.
  if slack > 0 and cur >= 0 and math.abs(cur - want) <= slack then return end
  redis.call('PEXPIRE', rec, want)
  if state then redis.call('PEXPIRE', state, want) end
end

-- fg_slack is the slack of fg_keep for admissions: a sixteenth of the
-- retention, at most one second.
local function fg_slack(ret)
  local r = tonumber(ret or '0') or 0
  return math.min(math.floor(r / 16), 1000)
end

-- fg_extend: see above.
local function fg_extend(rec, live, token, ttl, acq, now_ms, state, bar, ret)
  local exp = fg_fmt(now_ms + tonumber(ttl))
  redis.call('HSET', rec, 'ttl', ttl, 'exp', exp)
  redis.call('SET', live, token, 'PXAT', exp)
  fg_keep(rec, state, bar, ret, tonumber(exp), now_ms, 0)
  return fg_lease(token, ttl, acq, exp)
end
