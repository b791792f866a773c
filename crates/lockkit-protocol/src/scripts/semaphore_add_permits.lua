-- semaphore_add_permits: add to (or, with a negative delta, take from) a semaphore's total.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  delta: permits to add, negative to remove
-- ARGV[2]  the largest total accepted
-- ARGV[3]  the semaphore's channel (not used: grants go to the waiting clients' own channels)
-- ARGV[4]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[5]  the handle's configured total, '' when it has none: an absent total (never set, or
--          lost with the data) starts from it instead of from 0
--
-- Reply    {1, total}  done; total = the new total
--          {0, total}  refused: the total would go below zero (total = the current total)
--          {2, total}  refused: the total would exceed ARGV[2]
--
-- A semaphore whose total is absent starts from the configured total, or from 0. Removing permits
-- never takes them away from holders: while they keep more than the new total, no permit is free.
-- Added permits are granted to the line's head while it fits (grant_line). A total that was
-- absent or is lowered first refuses every waiting request that asks for more than it
-- (refuse_impossible): such a waiter is told at once, not when its keep-alive runs out.
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local delta, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local sharded = ARGV[4]

local now = now_ms()
purge(main, leases, now)
local reply
local current = tonumber(redis.call('HGET', main, 'permits'))
local total = current or configured_total(ARGV[5]) or 0
local new = total + delta
if new < 0 then
  reply = {0, total}
elseif new > max then
  reply = {2, total}
else
  redis.call('HSET', main, 'permits', new)
  if current == nil or delta < 0 then
    refuse_impossible(main, waiting, timeouts, sharded, now)
  end
  reply = {1, new}
end
grant_line(main, leases, waiting, timeouts, sharded, now, nil)
return reply
