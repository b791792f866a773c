-- lock_release_last: the common case of lock_release.lua (KEYS, ARGV and the reply are described
-- there), put in front of the libraries the script is compiled with (see lock.rs): the release of
-- the one live hold of a lock nobody waits for (the hash is that hold's marker and its owner's
-- count of 1) deletes the lock here, in four commands, before a single library function is
-- defined (see lock_acquire_free.lua). Every other case goes on to the libraries and
-- lock_release.lua, which read it again: the same reply as there, by the same rules (hold_lib.lua:
-- `live` is expiry > now + 1).
if string.sub(ARGV[1], 1, 1) == '#' and redis.call('EXISTS', KEYS[3]) == 0 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local fields = redis.call('HGETALL', KEYS[1])
  if #fields == 4 then
    -- The marker's field and value, and the other field: the owner's count.
    local at = (fields[1] == ARGV[1] and 1) or (fields[3] == ARGV[1] and 3)
    if at then
      local expiry, owner = string.match(fields[at + 1], '^(%d+) (.*)$')
      local other = 4 - at
      if expiry and tonumber(expiry) > now + 1 and fields[other] == owner and
          fields[other + 1] == '1' then
        redis.call('DEL', KEYS[1])
        return {1, 0}
      end
    end
  end
end
