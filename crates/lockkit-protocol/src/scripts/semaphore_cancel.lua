-- semaphore_cancel: take a request whose call stopped waiting (its wait timed out, its acquire
-- future was dropped, its client shut down) out of a semaphore's line, and hand on what a
-- release granted it (both semaphore kinds).
--
-- KEYS[1]  main HASH (see semaphore_lib.lua)
-- KEYS[2]  leases ZSET
-- KEYS[3]  waiting ZSET (the line, see semaphore_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  the request that stopped waiting (`<marker> <lease> <k> <channel>`)
-- ARGV[2]  the semaphore's channel (not used)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the request was waiting (its keep-alive not run out) or granted, and is removed;
--          {0} it was not
--
-- A grant a release made to the request that its client did not claim (the call gave up while
-- the grant was on its way) is given back at once, and the line is served again (grant_line):
-- the permits, and the place at the head the request may have blocked, go to the next requests.
-- Idempotent: a second run finds nothing to remove.
local main, leases, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, sharded = ARGV[1], ARGV[3]

local now = now_ms()
-- Counted only while live: a request whose keep-alive passed was gone already.
local deadline = tonumber(redis.call('ZSCORE', timeouts, member))
local removed = (deadline and deadline > now) and 1 or 0
leave_waiting(waiting, timeouts, member)
local marker = parse_request(member)
purge(main, leases, now)
if marker and redis.call('ZSCORE', leases, marker) then
  end_hold(main, leases, marker)
  removed = 1
end
grant_line(main, leases, waiting, timeouts, sharded, now, nil)
return {removed > 0 and 1 or 0}
