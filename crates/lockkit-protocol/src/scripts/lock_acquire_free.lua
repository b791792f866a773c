-- lock_acquire_free: the common case of lock_acquire.lua (KEYS, ARGV and the reply are described
-- there), put in front of the libraries the script is compiled with (see lock.rs): a free lock
-- that nobody waits for and that is reserved for nobody is taken here, in four commands, before
-- a single library function is defined. (Defining the libraries' functions, which every run of a
-- script does anew, cost Redis more than these four commands: issue 28.) Every other case goes
-- on to the libraries and lock_acquire.lua, with one of the four keys known to exist.
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 then
  if ARGV[7] == '1' then
    return {2}
  end
  -- hold_lib.lua's now_ms() + lease and hold_value(expiry, owner), written out.
  local time = redis.call('TIME')
  local expiry = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) +
    tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], ARGV[1], 1, ARGV[2], string.format('%d', expiry) .. ' ' .. ARGV[1])
  redis.call('PEXPIREAT', KEYS[1], expiry)
  return {1, 1}
end
