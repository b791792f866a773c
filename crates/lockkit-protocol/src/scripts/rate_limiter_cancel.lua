-- rate_limiter_cancel: give back the permits of a request (a reservation whose caller gave up,
-- or permits admitted and not used), when that is sound: only the last request of the schedule
-- can be taken back, since every later one was placed after it.
--
-- KEYS[1]  limit HASH (see rate_limiter_acquire)
-- KEYS[2]  waiting ZSET
-- KEYS[3]  this client's schedule HASH (per-client mode)
-- ARGV[1]  the request's marker
-- ARGV[2], ARGV[3]  unused (the shared leave contract: channel, sharded flag)
--
-- Reply    {1}  given back: the schedule moved back by the request's cost
--               (also to a re-sent copy of the request that gave them back)
--          {0}  nothing given back (a later request was placed after it, or the data was lost)
--          error WRONGTYPE  the keys hold something else
--
-- Idempotent: the first run clears the request as the last and notes it as `given`; a re-sent
-- copy finds it there and answers {1} again, changing nothing.
local marker = ARGV[1]
redis.call('ZREM', KEYS[2], marker)
local limit = rate_limit(KEYS[1])
if limit and limit.err then
  return limit
end
if not limit then
  return {0}
end
-- The schedule: in the limit's own HASH, or (per-client mode) in the client's.
local state = KEYS[1]
if limit.mode == 'per_client' then
  state = KEYS[3]
end
local s = redis.call('HMGET', state, 'tat', 'last', 'last_cost', 'given')
if s[4] == marker then
  return {1}
end
if s[2] ~= marker then
  return {0}
end
redis.call('HSET', state, 'tat', rate_fmt(tonumber(s[1]) - tonumber(s[3])), 'given', marker)
redis.call('HDEL', state, 'last', 'last_at', 'last_cost')
return {1}
