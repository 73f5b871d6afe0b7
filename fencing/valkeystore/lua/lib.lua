-- fencegate: helpers prepended to every script (see scripts.go).
--
-- Conventions shared by all scripts:
--   * A resource R has three keys, all hash-tagged with {R} so that every
--     script touches a single cluster slot:
--       <prefix>:{R}        hash: the record (never expires, never deleted)
--       <prefix>:{R}:state  string: the last checkpoint state
--       <prefix>:{R}:live   string: the live lease's token, expiring with
--                           the lease (PXAT); an index used only by List
--   * Record fields: issued, hw, floor (tokens, decimal strings); owner,
--     token, ttl (ms), acq, exp (server ms), rel, fin ("1"/"0") for the most
--     recent lease; p_owner, p_token, p_ended, p_fin for the lease before
--     it; cp_token, cp_ms, cp_size for the checkpoint.
--   * Tokens are decimal strings without leading zeros and are compared as
--     strings (length first), never as Lua numbers: Lua numbers are doubles
--     and a forged token may exceed 2^53.
--   * Time comes from the server's TIME, never from the caller.

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

