-- election_lib: the leader record and change channel of an election, put in front of its
-- proclaim, resign, leader and renew scripts at compile time (see election.rs). Needs
-- hold_lib.lua's now_ms and live_hold in front.
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
--   request  the id of the proclaim request that wrote it last: a re-sent request finds its id
--            and changes nothing
-- It lives exactly as long as the hold it names: every proclaim sets it to expire with the hold
-- (PEXPIREAT the hold's own expiry), and the election's renewal (election_renew) moves that
-- expiry with the hold's. A resignation deletes it, leaving `resigned` = the term alone while
-- the resigned hold is live (see election_resign.lua); a proclaim takes that mark out.
-- The change channel carries `l:<term>:<version>:<value>` (a leader announced a value: a new
-- term, or a proclaim under the same term; (term, version) orders announcements) and `r:<term>`
-- (the leader of that term resigned).

-- The expiry of the hold `marker` of `owner` if it is live in `key` at `now` and carries the
-- token `term`; else nil.
local function leads(key, marker, owner, term, now)
  local expiry, holder = live_hold(key, marker, now)
  if not expiry or (owner and holder ~= owner) then
    return nil
  end
  local token = redis.call('HGET', key, marker .. ':token')
  if token == false or tonumber(token) ~= tonumber(term) then
    return nil
  end
  return expiry
end

-- The record `record` of the live hold `marker` of `key` expires with that hold: PEXPIREAT its
-- expiry. Nothing is done when the record names another hold, is gone or is not a HASH.
local function follow_hold(key, record, marker, now)
  if redis.call('TYPE', record)['ok'] ~= 'hash' then
    return
  end
  if redis.call('HGET', record, 'marker') ~= marker then
    return
  end
  local expiry = live_hold(key, marker, now)
  if expiry then
    redis.call('PEXPIREAT', record, expiry)
  end
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
