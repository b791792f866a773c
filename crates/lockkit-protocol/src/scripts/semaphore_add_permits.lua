-- semaphore_add_permits: add to (or, with a negative delta, take from) a semaphore's total.
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- ARGV[1]  delta: permits to add, negative to remove
-- ARGV[2]  the largest total accepted
-- ARGV[3]  channel on which permits that came back are announced
-- ARGV[4]  announce with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
-- ARGV[5]  the handle's configured total, '' when it has none: an absent total (never set, or
--          lost with the data) starts from it instead of from 0
--
-- Reply    {1, total}  done; total = the new total
--          {0, total}  refused: the total would go below zero (total = the current total)
--          {2, total}  refused: the total would exceed ARGV[2]
--
-- A semaphore whose total is absent starts from the configured total, or from 0. Removing permits
-- never takes them away from holders: while they keep more than the new total, no permit is free.
-- Added permits are announced ('n:<k>'), so that many waiters try again. A total that was absent
-- or is lowered is announced to every waiter ('all'): a waiter whose request is now more than the
-- total must be refused at once, not when a holder's lease ends.
local main, leases = KEYS[1], KEYS[2]
local delta, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local channel, sharded = ARGV[3], ARGV[4]

local returned = purge(main, leases, now_ms())
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
    announce_total_changed(channel, sharded)
    return {1, new}
  end
  returned = returned + delta
  reply = {1, new}
end
announce(main, returned, channel, sharded)
return reply
