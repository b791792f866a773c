-- election_lib: the leader record and change channel of an election, put in front of its
-- proclaim, resign and leader scripts at compile time (see election.rs). Needs hold_lib.lua's
-- now_ms and live_hold in front.
--
-- An election's leadership is a fenced hold of its main key (the fenced lock's HASH, see
-- hold_lib.lua): the term is that hold's fencing token (field `<marker>:token`). The leader
-- record is a HASH:
--   term     the leader's term
--   value    the value the leader announced
--   marker   the leader's hold marker (a field of the main key)
--   owner    the owner id the hold counts for
--   version  how many announcements the record has carried (each proclaim adds one), so
--            announcements of one term are ordered
-- It expires after the record TTL (the client's token counter TTL), pushed on by every
-- proclaim; it is deleted by a resignation.
-- The change channel carries `l:<term>:<version>:<value>` (a leader announced a value: a new
-- term, or a proclaim under the same term; (term, version) orders announcements) and `r:<term>`
-- (the leader of that term resigned).

-- Whether the hold `marker` of `owner` is live in `key` at `now` and carries the token `term`.
local function leads(key, marker, owner, term, now)
  local expiry, holder = live_hold(key, marker, now)
  if not expiry or (owner and holder ~= owner) then
    return false
  end
  local token = redis.call('HGET', key, marker .. ':token')
  return token ~= false and tonumber(token) == tonumber(term)
end

-- Publishes `message` on the change channel: SPUBLISH when `sharded` = '1', else PUBLISH (a
-- failed publish must not undo the record's change: pcall).
local function announce(channel, sharded, message)
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, message)
  else
    redis.pcall('PUBLISH', channel, message)
  end
end
