-- confirm: record that a WAIT confirmed a high-water mark on replicas.
--
-- KEYS[1] -> <prefix>:{R}        record hash
-- ARGV[1] -> token t whose raise (or rewrite) of hw a WAIT confirmed
--
-- Sets the field hwc (the highest confirmed mark) to t when t > hwc and
-- t <= hw (hw may have moved past t meanwhile; t stays confirmed, the newer
-- mark does not). Returns "1" when hwc was set, else "0". Never creates a
-- record. Run only after the WAIT succeeded: it is written after hw in the
-- replication stream, so a replica that holds hwc = t also holds hw >= t,
-- and a rollback that loses hw loses hwc with it.
local rec = KEYS[1]
local t = ARGV[1]
local f = redis.call('HMGET', rec, 'hw', 'hwc')
local hw, hwc = f[1] or '0', f[2] or '0'
if fg_cmp(t, hw) > 0 or fg_cmp(t, hwc) <= 0 then
  return '0'
end
redis.call('HSET', rec, 'hwc', t)
return '1'
