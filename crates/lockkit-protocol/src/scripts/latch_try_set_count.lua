-- latch_try_set_count: start a count-down latch at `count`, only if it is at zero (absent).
--
-- KEYS[1]  count key: a STRING holding the count; absent = zero (the latch is open)
-- KEYS[2]  requests ZSET: member = request marker of a recent try_set_count or count_down,
--          score = when it ran (server ms); entries older than the window are dropped
-- ARGV[1]  request marker (#<client id>:<sequence>), unique per request
-- ARGV[2]  the count (> 0)
-- ARGV[3]  how long requests are remembered, in ms (the window)
--
-- Reply    {1}  set, by this request (also when this is a re-send of a request that set it)
--          {0}  the latch is already counting down (nothing changed)
--          error WRONGTYPE  the count key holds something else than a count (nothing changed)
--
-- Idempotent per request: a request re-sent after its first run set the count finds its marker
-- and reports success rather than "already set".
local key, requests = KEYS[1], KEYS[2]
local marker, window = ARGV[1], tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', requests, '-inf', now - window)
if redis.call('ZSCORE', requests, marker) then
  return {1}
end
-- GET fails with WRONGTYPE on a value of another type; a string that is no count is refused the
-- same way, rather than taken for a latch counting down.
local current = redis.call('GET', key)
if current then
  if not tonumber(current) then
    return redis.error_reply('WRONGTYPE the latch key holds a string that is not a count')
  end
  return {0}
end
redis.call('SET', key, ARGV[2])
redis.call('ZADD', requests, now, marker)
redis.call('PEXPIRE', requests, window)
return {1}
