-- rate_limiter_set_limit: store a rate limiter's limit (or only when none is stored).
--
-- KEYS[1]  limit HASH (see rate_limiter_acquire)
-- ARGV[1..4]  rate, interval (ms), burst, mode ('overall' | 'per_client')
-- ARGV[5]  1: only when no limit is stored; 0: in place of any stored one
-- ARGV[6]  request marker (<client id>:<sequence>), unique per request
--
-- Reply    {1}  stored
--          {0}  a limit is stored already (ARGV[5] = 1), by another request; nothing changed
--
-- Idempotent per request: the request that stored the limit is noted (`set_by`), so a re-sent
-- copy answers {1} again.
--          error WRONGTYPE  the key holds something else
--
-- The schedule (tat) stays: permits already admitted or reserved keep their times, and the new
-- limit applies from the next request on. The last request can still be given back: its cost is
-- stored in µs, as it was counted.
local limit = rate_limit(KEYS[1])
if limit and limit.err then
  return limit
end
if limit and ARGV[5] == '1' then
  if redis.call('HGET', KEYS[1], 'set_by') == ARGV[6] then
    return {1}
  end
  return {0}
end
redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'interval', ARGV[2], 'burst', ARGV[3],
  'mode', ARGV[4], 'set_by', ARGV[6])
return {1}
