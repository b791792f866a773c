-- rwlock_cancel: take a request whose call stopped waiting (its wait timed out, its acquire future
-- was dropped, its client shut down) out of a read-write lock's line, and hand on what a release
-- granted it.
--
-- KEYS[1]  lock key (see rwlock_acquire.lua)
-- KEYS[2]  expiries
-- KEYS[3]  waiting ZSET (the line, see rwlock_acquire.lua)
-- KEYS[4]  timeouts ZSET
-- ARGV[1]  the request that stopped waiting (`<marker> <lease> <r|w>:<owner> <channel>`)
-- ARGV[2]  the lock's channel (not used)
-- ARGV[3]  publish with 1: SPUBLISH (sharded), 0: PUBLISH, 2: PUBLISH on a cluster
--
-- Reply    {1} the request was waiting (its keep-alive not run out) or granted, and is removed;
--          {0} it was not
--
-- A hold a release granted to the request that its client did not claim (the call gave up while
-- the grant was on its way) is given back at once, and the line is served again (grant_line):
-- the lock, and the place at the head the request may have blocked, go to the next requests.
-- Idempotent: a second run finds nothing to remove.
local key, expiries, waiting, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, sharded = ARGV[1], ARGV[3]

local now = now_ms()
-- Counted only while live: a request whose keep-alive passed was gone already.
local deadline = tonumber(redis.call('ZSCORE', timeouts, member))
local removed = (deadline and deadline > now) and 1 or 0
leave_waiting(waiting, timeouts, member)
local marker = parse_request(member)
purge(key, expiries, now)
if marker then
  local field, left = drop(key, expiries, marker)
  if field then
    settle(key, expiries, string.sub(field, 1, 2) == 'w:' and left <= 0)
    removed = 1
  end
end
grant_line(key, expiries, waiting, timeouts, sharded, now, nil)
return {removed}
