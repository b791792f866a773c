-- rate_limiter_status: a rate limiter's limit, the permits one request could take now, and how
-- many reservations are still to come (members of the waiting ZSET whose moment has not passed).
-- Changes nothing.
--
-- KEYS[1]  limit HASH (see rate_limiter_acquire)
-- KEYS[2]  waiting ZSET
-- KEYS[3]  this client's schedule HASH (per-client mode)
--
-- Reply    {1, rate, interval ms, burst, per_client (0|1), available, now (µs), waiting}
--          {0, now (µs), waiting}  no limit is stored
--          error WRONGTYPE  the keys hold something else
local now = rate_now()
local waiting = redis.call('ZCOUNT', KEYS[2], '(' .. rate_fmt(now / 1000), '+inf')
local limit = rate_limit(KEYS[1])
if limit and limit.err then
  return limit
end
if not limit then
  return {0, now, waiting}
end
-- The schedule: in the limit's own HASH, or (per-client mode) in the client's.
local state = KEYS[1]
if limit.mode == 'per_client' then
  state = KEYS[3]
end
local tat = tonumber(redis.call('HGET', state, 'tat')) or now
local available = limit.burst + 1
if tat > now then
  local t = rate_emission(limit)
  available = math.floor((now + limit.burst * t - tat) / t) + 1
  if available < 0 then
    available = 0
  end
end
local per_client = 0
if limit.mode == 'per_client' then
  per_client = 1
end
return {1, limit.rate, limit.interval, limit.burst, per_client, available, now, waiting}
