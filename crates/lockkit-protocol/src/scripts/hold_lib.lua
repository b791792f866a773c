-- hold_lib: per-hold leases of the reentrant hash locks (lock, fenced lock, fair lock), put in
-- front of their acquire, release and renew scripts at compile time (see lock.rs).
--
-- The lock HASH:
--   <owner>          that owner's hold count (the owner id is opaque: never parsed)
--   #<hold>          one outstanding hold (the hold marker): `<expiry> <owner>`, the hold's own
--                    expiry in server milliseconds (from TIME, never a client clock), a space,
--                    and the owner it counts for
--   #<hold>:token    a fenced lock's hold: its fencing token (a number, no space)
-- A hold is live while its expiry is in the future. The key expires with the latest live hold
-- (PEXPIREAT), so it exists exactly while one is left; every script that reads the hash first
-- ends the holds whose lease has run out (`settle`), each giving back one count of its owner.

-- The server's clock in milliseconds. Expiries are only ever compared with this clock.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Whether a hold with this expiry is live at `now`. A hold in its last millisecond counts as
-- ended: the key expires with its latest hold (PEXPIREAT), and Redis checks key expiry on its own
-- clock, which can pass a millisecond boundary that `now` (TIME, taken once) has not. A hold
-- treated as live at `now` = expiry - 1 could then vanish with its key in the middle of the
-- script (a release that found the owner's other hold live read the owner's count as nil and
-- replied {2, nil}; a re-entry found the owner gone). With the margin, the key of every hold
-- treated as live expires at least 2 ms after `now`.
local function live(expiry, now)
  return expiry > now + 1
end

-- The value of a hold marker: its expiry and its owner.
local function hold_value(expiry, owner)
  return string.format('%d', expiry) .. ' ' .. owner
end

-- The expiry (a number) and owner of a field's value if the field is a hold marker; else nil.
local function parse_hold(field, value)
  if string.sub(field, 1, 1) ~= '#' then
    return nil
  end
  local expiry, owner = string.match(value, '^(%d+) (.*)$')
  if not expiry then
    return nil
  end
  return tonumber(expiry), owner
end

-- The expiry and owner of the live hold `marker` at `now`; nil when there is no such live hold.
local function live_hold(key, marker, now)
  local value = redis.call('HGET', key, marker)
  if not value then
    return nil
  end
  local expiry, owner = parse_hold(marker, value)
  if not expiry or not live(expiry, now) then
    return nil
  end
  return expiry, owner
end

-- Ends every hold of `key` whose lease ran out by `now` (see `live`), and the hold `gone` (a marker being
-- released; nil for none): each loses its fields and gives back one count of its owner. Then,
-- if a hold ended, the key expires with the latest hold left; it is deleted when none is left
-- (in one DEL: the ended holds' fields go with it). Nothing is written when nothing ended (a
-- renewal that finds its hold live sets no expiry). Returns the latest expiry left (nil: the key
-- is gone) and, when `gone` was a live hold, its owner (nil: it was not there, or its lease had
-- run out).
local function settle(key, now, gone)
  local fields = redis.call('HGETALL', key)
  local latest, released, ended = nil, nil, {}
  for i = 1, #fields, 2 do
    local field = fields[i]
    local expiry, owner = parse_hold(field, fields[i + 1])
    if expiry then
      if live(expiry, now) and field == gone then
        released = owner
      end
      if not live(expiry, now) or field == gone then
        ended[#ended + 1] = field
        ended[#ended + 1] = owner
      elseif not latest or expiry > latest then
        latest = expiry
      end
    end
  end
  if not latest then
    if #fields > 0 then
      redis.call('DEL', key)
    end
  elseif #ended > 0 then
    for i = 1, #ended, 2 do
      local field, owner = ended[i], ended[i + 1]
      redis.call('HDEL', key, field, field .. ':token')
      if redis.call('HINCRBY', key, owner, -1) <= 0 then
        redis.call('HDEL', key, owner)
      end
    end
    redis.call('PEXPIREAT', key, latest)
  end
  return latest, released
end

-- Gives back the hold `marker` at `now` (settle). Returns the release reply when the lock stays
-- held ({2, the owner's count left}) or the hold was not there ({0, 0}); nil when the lock is now
-- free, for the caller to announce.
local function give_back(key, now, marker)
  local latest, owner = settle(key, now, marker)
  if not owner then
    return {0, 0}
  end
  if latest then
    return {2, tonumber(redis.call('HGET', key, owner))}
  end
  return nil
end

-- Records the hold `marker` of `owner` with its own `expiry` (one more count for the owner unless
-- `counted`: a re-sent request whose first run counted it), and makes the key live at least as
-- long. `latest` is the latest expiry of the other live holds (nil: none). Returns the owner's
-- hold count.
local function take(key, owner, marker, expiry, latest, counted)
  local count
  if counted then
    count = tonumber(redis.call('HGET', key, owner) or 0)
  else
    count = redis.call('HINCRBY', key, owner, 1)
  end
  redis.call('HSET', key, marker, hold_value(expiry, owner))
  if not latest or expiry > latest then
    redis.call('PEXPIREAT', key, expiry)
  end
  return count
end

-- The expiry a renewal argument asks for at `now`: `<lease ms>` is now + lease (0: nil, only
-- check); `@<server ms>` is that instant itself, the confirmation of a granted hold whose lease is
-- counted from its grant (handoff_lib.lua: grant time + lease, whenever the confirmation comes).
local function renewal_target(arg, now)
  if string.sub(arg, 1, 1) == '@' then
    return tonumber(string.sub(arg, 2))
  end
  local lease = tonumber(arg)
  if lease and lease > 0 then
    return now + lease
  end
  return nil
end

-- Renews the live hold `marker` to what the renewal argument `arg` asks for (renewal_target;
-- never shortening it; nil target: only checks). Returns 1 when the hold is live (and so
-- renewed), 0 when it is gone. Expired holds are ended first, so an expired hold is never
-- revived; a released one has no marker left to find.
local function renew_hold(key, marker, arg, now)
  if redis.call('TYPE', key)['ok'] ~= 'hash' then
    return 0
  end
  local latest = settle(key, now, nil)
  local expiry, owner = live_hold(key, marker, now)
  if not expiry then
    return 0
  end
  local target = renewal_target(arg, now)
  if target and expiry < target then
    take(key, owner, marker, target, latest, true)
  end
  return 1
end
