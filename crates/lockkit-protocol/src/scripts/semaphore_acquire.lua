-- semaphore_acquire: take k permits of a semaphore as one hold (both semaphore kinds).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET: the line (line_lib.lua; a request is `<marker> <lease> <k> <channel>`)
-- KEYS[4]  timeouts ZSET: each request's keep-alive deadline
-- ARGV[1]  hold marker (#<client id>:<sequence>), the same for every try of one acquire call
-- ARGV[2]  permits to take, k > 0
-- ARGV[3]  lease in milliseconds (> 0)
-- ARGV[4]  the calling client's own channel for the semaphore: a grant to this call is published
--          there
-- ARGV[5]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[6]  the handle's configured total, '' when it has none: when the total is absent (never
--          set, or lost with the data: an empty restart, FLUSHALL, eviction, a failover to a
--          lagging replica), it is set to this first, atomically; the first initialiser wins, as
--          with semaphore_try_set_permits
-- ARGV[7]  keep-alive in ms: when refused, join the line (or stay in it) until now + keep-alive;
--          0 or absent = do not wait: never join, and leave the line if this request is in it
--          (`try_acquire` with a zero wait, or the last try of a wait that ran out)
--
-- Reply    {1, available}    acquired; available = the permits still free afterwards
--          {0, wait, now}    refused: too few permits are free, or others wait ahead of this call;
--                            wait = ms until the earliest lease of a holder ends (-1: none), now
--                            = the server clock (ms)
--          {2, total}        refused: k is more than the total, it would never be granted
--          {3, 0}            refused: the semaphore's permits were never set (and no configured
--                            total was given)
--
-- FIFO (semaphore_lib.lua): the line is served first (grant_line, stopping at this call's own
-- request); this call takes permits only when nobody waits ahead of it and k are free, so a call
-- never overtakes the line, whether it waits or not (`try_acquire` with a zero wait is refused
-- while anyone waits). A call refused and waiting joins the line; a later release grants it its
-- permits directly (the grant: its marker holds them), and this script, run again with the same
-- marker, reports them.
-- Idempotent per request: a request re-sent after its first run took the permits (or was granted
-- them) finds its marker, takes nothing more and reports success. The lease is never shortened.
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, k, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local channel, sharded, keepalive = ARGV[4], ARGV[5], ARGV[7] or '0'
local member = request(marker, ARGV[3], ARGV[2], channel)

local now = now_ms()
purge(main, leases, now)
local total = tonumber(redis.call('HGET', main, 'permits'))
if total == nil then
  total = configured_total(ARGV[6])
  if total == nil then
    stay_in_line(waiting, timeouts, member, '0', now)
    return {3, 0}
  end
  redis.call('HSET', main, 'permits', total)
  refuse_impossible(main, waiting, timeouts, sharded, now)
end

local reply
local score = redis.call('ZSCORE', leases, marker)
if score then
  -- Re-sent, or granted by a release: the hold is this call's.
  if tonumber(score) < now + lease then
    redis.call('ZADD', leases, now + lease, marker)
  end
  leave_waiting(waiting, timeouts, member)
  reply = {1, available(main)}
elseif k > total then
  leave_waiting(waiting, timeouts, member)
  reply = {2, total}
else
  grant_line(main, leases, waiting, timeouts, sharded, now, marker)
  local head = head_of_line(waiting)
  if (head == nil or head == member) and available(main) >= k then
    redis.call('HSET', main, marker, k)
    redis.call('HINCRBY', main, 'used', k)
    redis.call('ZADD', leases, now + lease, marker)
    leave_waiting(waiting, timeouts, member)
    reply = {1, available(main)}
  else
    stay_in_line(waiting, timeouts, member, keepalive, now)
    local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
    reply = {0, first[2] and math.max(tonumber(first[2]) - now, 0) or -1, now}
  end
end
-- What this call left (it took its permits, was refused, or left the line) may let the next
-- head in.
grant_line(main, leases, waiting, timeouts, sharded, now, nil)
return reply
