-- fenced_lock_release: give back one hold of a fenced lock.
--
-- KEYS[1]  lock key (see fenced_lock_acquire.lua)
-- KEYS[2]  token counter (not touched: tokens only grow)
-- ARGV[1]  hold marker of the hold to give back
-- ARGV[2]  channel on which the unlock is announced
-- ARGV[3]  1 to announce with SPUBLISH (sharded pub/sub), 0 with PUBLISH
--
-- Reply    as lock_release.lua: {1, 0} freed and announced; {2, n} the owner still holds n;
--          {0, 0} the hold was not there
local key, marker, channel, sharded = KEYS[1], ARGV[1], ARGV[2], ARGV[3]

local owner = redis.call('HGET', key, marker)
if not owner then
  return {0, 0}
end
local count = redis.call('HINCRBY', key, owner, -1)
if count > 0 then
  redis.call('HDEL', key, marker, marker .. ':token')
  return {2, count}
end
redis.call('DEL', key)
if sharded == '1' then
  redis.pcall('SPUBLISH', channel, 'one')
else
  redis.pcall('PUBLISH', channel, 'one')
end
return {1, 0}
