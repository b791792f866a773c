-- spin_lock_acquire: take a plain, non-reentrant lock (the seed's SET NX PX).
--
-- KEYS[1]  lock key: a string holding the holder's hold marker; its TTL is the lease
-- ARGV[1]  hold marker, unique per acquire request
-- ARGV[2]  lease in milliseconds (> 0)
--
-- Reply    {1}        acquired
--          {0, pttl}  held (by anyone, the same task included: not reentrant); pttl -1: no expiry
--
-- Idempotent per request: a re-sent request whose first run took the lock finds its own marker.
local key, marker = KEYS[1], ARGV[1]

if redis.call('SET', key, marker, 'NX', 'PX', ARGV[2]) then
  return {1}
end
if redis.call('GET', key) == marker then
  return {1}
end
return {0, redis.call('PTTL', key)}
