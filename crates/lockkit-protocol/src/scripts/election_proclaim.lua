-- election_proclaim: the leader announces its value (after its election, or a new value under the
-- same term).
--
-- KEYS[1]  election main key (the fenced hold HASH, see election_lib.lua)
-- KEYS[2]  leader record (HASH term, value, marker, owner)
-- ARGV[1]  the leader's hold marker
-- ARGV[2]  the owner the hold counts for
-- ARGV[3]  the leader's term (its hold's fencing token)
-- ARGV[4]  the value to announce (any string, may be empty)
-- ARGV[5]  the change channel
-- ARGV[6]  publish with 1: SPUBLISH (sharded), else PUBLISH
-- ARGV[7]  the record's TTL in ms (whole number >= 1)
--
-- Reply    {1}: the hold is live and carries the term: the record now says term, value, marker
--          and owner, its version went up by one, it expires after the TTL, and
--          `l:<term>:<version>:<value>` was published;
--          {0}: not the leader any more (the hold is gone or its lease ran out): nothing written.
local key, record = KEYS[1], KEYS[2]
local marker, owner, term, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local channel, sharded = ARGV[5], ARGV[6]
local ttl = tonumber(ARGV[7])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR lockkit: the leader record TTL must be a whole number of ms >= 1, got ' ..
    tostring(ARGV[7]))
end
if not leads(key, marker, owner, term, now_ms()) then
  return {0}
end
redis.call('HSET', record, 'term', term, 'value', value, 'marker', marker, 'owner', owner)
local version = redis.call('HINCRBY', record, 'version', 1)
redis.call('PEXPIRE', record, ARGV[7])
announce(channel, sharded, 'l:' .. term .. ':' .. version .. ':' .. value)
return {1}
