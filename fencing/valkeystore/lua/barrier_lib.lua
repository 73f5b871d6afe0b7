-- fencegate: shared-barrier helpers, prepended (after lib.lua) to the
-- barrier scripts (see barrier.go).
--
--   <prefix>:{R}:bar  sorted set: one member per write in flight through
--                     any gate, score = its token, member =
--                     "<deadline ms>|<gate id>:<instance>:<seq>" (instance:
--                     random per store, so gates given one id never share a
--                     member). The key's own TTL
--                     reaches at least the latest deadline, so entries a
--                     crashed gate left vanish with it.
--   <prefix>:{R}:bar:ch  the shard channel (SPUBLISH) on which a leave is
--                     announced; it shares the resource's hash tag, so on a
--                     cluster it lives on the resource's slot.

-- fg_lower looks at the entries of bar with a token below t: it removes
-- those whose deadline has passed and returns how many live ones remain,
-- the milliseconds until the earliest of their deadlines (0 if none) and
-- how many it removed.
local function fg_lower(bar, t, now_ms)
  local members = redis.call('ZRANGEBYSCORE', bar, '-inf', '(' .. t)
  local live, earliest, expired = 0, 0, 0
  for _, m in ipairs(members) do
    local dl = tonumber(string.match(m, '^(%d+)|'))
    if dl == nil or dl <= now_ms then
      redis.call('ZREM', bar, m)
      expired = expired + 1
    else
      live = live + 1
      if earliest == 0 or dl - now_ms < earliest then
        earliest = dl - now_ms
      end
    end
  end
  return live, earliest, expired
end
