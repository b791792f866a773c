-- election_leader: who leads now.
--
-- KEYS[1]  election main key (the fenced hold HASH)
-- KEYS[2]  leader record (see election_lib.lua)
--
-- Reply    an array of strings (the value is any string, so every element is one):
--          {'1', term, version, value}: the record's hold is live and carries the record's term
--          (version: the record's count of announcements, see election_lib.lua);
--          {'0'}: no leader has announced itself (no record, or its hold ended: the leader's
--          lease ran out, or it was released without a resignation).
local key, record = KEYS[1], KEYS[2]
local fields = redis.call('HMGET', record, 'term', 'value', 'marker', 'owner', 'version')
local term, value, marker, owner, version = fields[1], fields[2], fields[3], fields[4], fields[5]
if not term or not value or not marker or not owner or not version then
  return {'0'}
end
if not leads(key, marker, owner, term, now_ms()) then
  return {'0'}
end
return {'1', term, version, value}
