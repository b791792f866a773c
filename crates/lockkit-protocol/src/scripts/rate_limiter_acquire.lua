-- rate_limiter_acquire: take `permits` permits now, or reserve them for the moment the limit
-- frees them (the caller sleeps until then), or say when they could be had.
--
-- KEYS[1]  limit HASH: rate, interval (ms), burst, mode ('overall' | 'per_client'), set_by; in
--          the overall mode also the schedule: tat (µs), last, last_at (µs), last_cost (µs), given
-- KEYS[2]  waiting ZSET: member = marker of a reservation still to come, score = its moment
--          (server ms, with its µs as the fraction)
-- KEYS[3]  this client's schedule HASH (per-client mode only): tat, last, last_at, last_cost,
--          given; it expires once idle
-- ARGV[1]  permits (>= 1)
-- ARGV[2]  the longest the caller may wait for them, in µs (-1: no bound)
-- ARGV[3]  request marker (<client id>:<sequence>), unique per request
-- ARGV[4..7] the limit the caller's handle is configured with (rate, interval ms, burst, mode),
--          written when none is stored (the data was lost); ARGV[4] = '' when none
-- ARGV[8]  the limiter's channel
-- ARGV[9]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, delay, at, far} admitted at `at` (server µs); delay > 0: reserved, the caller
--                             sleeps `delay` µs (then the permits are its); far = 1 when the
--                             moment is more than one interval ahead (the caller listens for a
--                             loss of the data meanwhile, and re-checks its reservation)
--          {0, earliest, now} refused: the permits come in `earliest` µs, more than the caller
--                             may wait; nothing changed
--          {-1}               no limit is set, and the caller configured none
--          {-2, most}         more permits than the limit ever admits at once (most = burst + 1)
--          error WRONGTYPE    the keys hold something else
--
-- GCRA: tat is the theoretical arrival time of the next permit; T = interval / rate; the
-- tolerance is burst * T. `permits` are admitted at the first moment `at` >= now with
-- max(tat, now) + (permits - 1) * T - tolerance <= at (rounded up to a whole µs), and tat moves
-- on by permits * T (from `at`, should the rounding put `at` past tat). In any window of one
-- interval at most rate + burst permits are admitted.
-- A limit found missing and written from the caller's configured one means the data was lost
-- (or this is the first use): the script announces `all` on the channel, so callers sleeping on
-- a reservation far ahead re-check it (theirs is gone with the data) and ask again.
-- Idempotent per request: a re-sent copy finds its marker as the last request and answers as
-- the first run did.
local now = rate_now()
local limit = rate_limit(KEYS[1])
if limit and limit.err then
  return limit
end
if not limit then
  if ARGV[4] == '' then
    return {-1}
  end
  redis.call('HSET', KEYS[1], 'rate', ARGV[4], 'interval', ARGV[5], 'burst', ARGV[6],
    'mode', ARGV[7])
  limit = rate_limit(KEYS[1])
  if ARGV[9] == '1' then
    redis.pcall('SPUBLISH', ARGV[8], 'all')
  else
    redis.pcall('PUBLISH', ARGV[8], 'all')
  end
end
local permits = tonumber(ARGV[1])
if permits > limit.burst + 1 then
  return {-2, limit.burst + 1}
end
-- The schedule: in the limit's own HASH, or (per-client mode) in the client's.
local state = KEYS[1]
if limit.mode == 'per_client' then
  state = KEYS[3]
end
local marker = ARGV[3]
local s = redis.call('HMGET', state, 'tat', 'last', 'last_at')
local horizon = limit.interval * 1000
if s[2] == marker then
  local at = tonumber(s[3])
  local far = 0
  if at - now > horizon then
    far = 1
  end
  return {1, math.max(0, at - now), at, far}
end
local t = rate_emission(limit)
local tat = tonumber(s[1]) or now
if tat < now then
  tat = now
end
local at = math.ceil(tat + (permits - 1) * t - limit.burst * t)
if at < now then
  at = now
end
local delay = at - now
local wait = tonumber(ARGV[2])
if wait >= 0 and delay > wait then
  return {0, delay, now}
end
-- The request's permits take the slots start, start + T, ... of the schedule. `at` is a whole µs,
-- rounded up: should that put it past the first slot, the slots start at `at`, so every permit's
-- slot lies in [at, at + burst * T] and the window bound holds on the whole-µs moments reported.
local start = tat
if at > start then
  start = at
end
local cost = start - tat + permits * t
redis.call('HSET', state, 'tat', rate_fmt(tat + cost), 'last', marker, 'last_at', at,
  'last_cost', rate_fmt(cost))
if state ~= KEYS[1] then
  -- Idle once tat has passed; kept a minute longer, so a re-sent copy still finds its marker.
  redis.call('PEXPIRE', state, math.ceil((tat + cost - now) / 1000) + 60000)
end
if delay > 0 then
  -- Scores are the moments in ms with their µs, so "to come" is exact: moment > now.
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. rate_fmt(now / 1000))
  redis.call('ZADD', KEYS[2], rate_fmt(at / 1000), marker)
  redis.call('PEXPIRE', KEYS[2], math.ceil(delay / 1000) + 1000)
end
local far = 0
if delay > horizon then
  far = 1
end
return {1, delay, at, far}
