-- barrier_leave: remove an entry and wake the writes behind it.
--
-- KEYS[1] -> <prefix>:{R}:bar
-- ARGV[1] -> the entry's member, ARGV[2] -> its token
-- ARGV[3] -> the resource's shard channel (<prefix>:{R}:bar:ch)
--            (a channel, not a key: SPUBLISH touches no key; it shares
--            KEYS[1]'s hash tag, so it lives on the script's slot)
--
-- Publishes only when the entry was there and a higher-token entry (a
-- write that may be waiting) remains. Returns 1 if removed, else 0.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 and redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[2], '+inf') > 0 then
  redis.call('SPUBLISH', ARGV[3], ARGV[2])
end
return removed
