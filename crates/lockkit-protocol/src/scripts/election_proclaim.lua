-- election_proclaim: the leader announces its value (after its election, or a new value under the
-- same term).
--
-- KEYS[1]  election main key (the fenced hold HASH, see election_lib.lua)
-- KEYS[2]  leader record (HASH term, value, marker, owner, version, request)
-- ARGV[1]  the leader's hold marker
-- ARGV[2]  the owner the hold counts for
-- ARGV[3]  the leader's term (its hold's fencing token)
-- ARGV[4]  the value to announce (any string, may be empty)
-- ARGV[5]  the change channel
-- ARGV[6]  publish with 1: SPUBLISH (sharded), else PUBLISH
-- ARGV[7]  the request id: unique per proclaim call of this hold, the same for every send of
--          one call (non-empty)
--
-- Reply    {1}: the hold is live and carries the term: the record now says term, value, marker,
--          owner and request, its version went up by one, it expires with the hold (PEXPIREAT
--          the hold's own expiry), and `l:<term>:<version>:<value>` was published;
--          {1} also, with nothing written and nothing published, when the record already
--          carries this marker's request ARGV[7]: a re-sent request whose first run announced
--          answers as that run did;
--          {0}: not the leader any more (the hold is gone or its lease ran out): nothing written.
local key, record = KEYS[1], KEYS[2]
local marker, owner, term, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local channel, sharded, request = ARGV[5], ARGV[6], ARGV[7]
if not request or request == '' then
  return redis.error_reply('ERR lockkit: election_proclaim needs a request id (ARGV[7])')
end
local seen = redis.call('HMGET', record, 'marker', 'request')
if seen[1] == marker and seen[2] == request then
  return {1}
end
local expiry = leads(key, marker, owner, term, now_ms())
if not expiry then
  return {0}
end
-- A resigned term's mark (election_resign) goes: the record is this leader's now.
redis.call('HDEL', record, 'resigned')
redis.call('HSET', record, 'term', term, 'value', value, 'marker', marker, 'owner', owner,
  'request', request)
local version = redis.call('HINCRBY', record, 'version', 1)
redis.call('PEXPIREAT', record, string.format('%d', expiry))
announce(channel, sharded, 'l:' .. term .. ':' .. version .. ':' .. value)
return {1}
