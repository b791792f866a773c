-- election_resign: the leader of a term steps down: its record goes and the change channel says
-- so. The client then gives back its hold with fenced_lock_release, which grants the election to
-- the longest-waiting candidate at once. Until then the hold is live without a record, as a new
-- leader's is before it announces itself: so the record's key keeps `resigned` = the term alone,
-- expiring with the hold, and election_leader answers that this term is over (an observer whose
-- read falls between the two drops the term's announcements, all published before it).
--
-- KEYS[1]  election main key (the resigned hold's expiry is read there)
-- KEYS[2]  leader record (see election_lib.lua)
-- ARGV[1]  the leader's hold marker
-- ARGV[2]  the leader's term
-- ARGV[3]  the change channel
-- ARGV[4]  publish with 1: SPUBLISH (sharded), else PUBLISH
--
-- Reply    {1}: the record was this term's (and this hold's): deleted (`resigned` = term left
--          while the hold is live), `r:<term>` published;
--          {0}: the record names another term (a later leader proclaimed) or is gone: nothing
--          written.
local key, record = KEYS[1], KEYS[2]
local marker, term, channel, sharded = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local fields = redis.call('HMGET', record, 'term', 'marker')
if not fields[1] or tonumber(fields[1]) ~= tonumber(term) or fields[2] ~= marker then
  return {0}
end
redis.call('DEL', record)
local expiry = live_hold(key, marker, now_ms())
if expiry then
  redis.call('HSET', record, 'resigned', term)
  redis.call('PEXPIREAT', record, string.format('%d', expiry))
end
announce(channel, sharded, 'r:' .. term)
return {1}
