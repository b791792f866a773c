-- latch_count_down: count a latch down by one; at zero, delete it and wake every waiter.
--
-- KEYS[1]  count key (see latch_try_set_count.lua)
-- KEYS[2]  requests ZSET (see latch_try_set_count.lua)
-- ARGV[1]  request marker (#<client id>:<sequence>), unique per request
-- ARGV[2]  how long requests are remembered, in ms (the window)
-- ARGV[3]  channel on which reaching zero is announced ('all')
-- ARGV[4]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1, count}  counted down; count = the new count (0: the latch opened, the key was
--                      deleted and every waiter woken). For a re-sent request whose first run
--                      counted: the current count, and nothing is counted again.
--          {0, 0}      refused: the latch is already at zero (absent)
--
-- Idempotent per request: the marker of every count-down is remembered for the window (it
-- outlives the count key, so a re-send that arrives after the latch opened is recognised too).
local key, requests = KEYS[1], KEYS[2]
local marker, window, channel, sharded = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', requests, '-inf', now - window)
if redis.call('ZSCORE', requests, marker) then
  return {1, tonumber(redis.call('GET', key)) or 0}
end
local value = redis.call('GET', key)
if not value then
  return {0, 0}
end
local current = tonumber(value)
if current == nil or current ~= math.floor(current) then
  return redis.error_reply('WRONGTYPE the latch count is not an integer')
end
if current <= 0 then
  return {0, 0}
end
local count = redis.call('DECR', key)
redis.call('ZADD', requests, now, marker)
redis.call('PEXPIRE', requests, window)
if count <= 0 then
  redis.call('DEL', key)
  if sharded == '1' then
    redis.pcall('SPUBLISH', channel, 'all')
  else
    redis.pcall('PUBLISH', channel, 'all')
  end
  return {1, 0}
end
return {1, count}
