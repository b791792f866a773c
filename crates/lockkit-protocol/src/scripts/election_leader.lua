-- election_leader: who leads now; when nobody announced leads, where the change channel stands.
--
-- KEYS[1]  election main key (the fenced hold HASH)
-- KEYS[2]  leader record (see election_lib.lua)
-- KEYS[3]  token counter (the fenced lock's, see fenced_lock_acquire.lua)
--
-- Reply    an array of strings (the value is any string, so every element is one):
--          {'1', term, version, value}: the record's hold is live and carries the record's term
--          (version: the record's count of announcements, see election_lib.lua);
--          otherwise no leader has announced itself (no record, or its hold ended: the leader's
--          lease ran out, or it was released without a resignation), and the reply is a position
--          on the change channel, for an observer to drop what was published before this read:
--          {'0', term, '0'}: a live hold of `term` leads but the record is not its own: a new
--          leader that has not announced itself yet (its `l:<term>:1:...` comes after this
--          read). Every announcement of a smaller term was published before this read;
--          {'0', term, '1'}: the live hold of `term` resigned and has not released its hold yet
--          (the record's key says `resigned` = term, see election_resign.lua): every
--          announcement of a term up to it was published before this read;
--          {'0', term, '1'}: no hold is live; `term` is the token counter ('0' when it is gone:
--          lost with the data, or expired a TTL after its last mint). Every announcement of a
--          term up to it was published before this read: the next leader's term is greater.
local key, record, counter = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local fields = redis.call('HMGET', record, 'term', 'value', 'marker', 'owner', 'version')
local term, value, marker, owner, version = fields[1], fields[2], fields[3], fields[4], fields[5]
if term and value and marker and owner and version and leads(key, marker, owner, term, now) then
  return {'1', term, version, value}
end
-- The live hold with the greatest term (an election has one leader; a re-entry would add one).
local held = nil
local hash = redis.call('HGETALL', key)
for i = 1, #hash, 2 do
  local expiry = parse_hold(hash[i], hash[i + 1])
  if expiry and live(expiry, now) then
    local token = redis.call('HGET', key, hash[i] .. ':token')
    if token and (not held or tonumber(token) > tonumber(held)) then
      held = token
    end
  end
end
if held then
  -- Resigned, its release not run yet (election_resign): over.
  local resigned = redis.call('HGET', record, 'resigned')
  if resigned and tonumber(resigned) == tonumber(held) then
    return {'0', held, '1'}
  end
  return {'0', held, '0'}
end
return {'0', redis.call('GET', counter) or '0', '1'}
