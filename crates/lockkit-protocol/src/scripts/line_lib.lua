-- line_lib: the line of waiting requests and its direct grant, one mechanism for every primitive
-- whose releases grant (the lock and fenced lock through handoff_lib.lua, both semaphores through
-- semaphore_lib.lua), put in front of their scripts at compile time:
--   waiting   a ZSET request -> when it first found the object busy (server microseconds): the
--             order of the line
--   timeouts  a ZSET request -> its keep-alive deadline (server ms), pushed on by every retry; a
--             request whose deadline passed stopped waiting (gave up unseen, or its client died)
-- A request is one waiting acquire call: `<marker> <lease ms> <ask> <channel>`, with the call's
-- hold marker (the same for every try of the call), the lease it asked for, what it asks for (a
-- lock's: its owner; a semaphore's: its number of permits), and the waiting client's own channel
-- for the object (the last field: it may contain spaces).
--
-- Direct grant (serve_line): whatever frees room (a release, a lease found run out, permits
-- added) walks the line from its head and grants each head request that fits, in the same
-- script, publishing the grant on that request's channel, to that one client (grant_line_told:
-- one message per client, however many of its calls were granted); the walk stops at the first
-- head that does not fit, so nothing behind it overtakes it. A grant nobody heard (the client is
-- gone, or has not subscribed yet) is undone and the walk goes on. A grant
-- starts on probation: it expires after min(lease, PROBATION_MS) unless its client confirms it
-- (renews it to its lease counted from the grant, the renew scripts' `@<server ms>`), so a grant
-- to a client that died unseen costs the others at most the probation, never a lease.

-- The probation of a grant in ms (lockkit_protocol::lock::GRANT_PROBATION).
local PROBATION_MS = 5000

-- Makes `k` live at least `ms` more milliseconds.
local function extend(k, ms)
  if redis.call('PTTL', k) < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- A request's member string.
local function request(marker, lease, ask, channel)
  return marker .. ' ' .. lease .. ' ' .. ask .. ' ' .. channel
end

-- A request's marker, lease (a number), ask (a string) and channel; nil for a malformed one.
local function parse_request(member)
  local marker, lease, ask, channel = string.match(member, '^(%S+) (%d+) (%S+) (.*)$')
  if not marker then
    return nil
  end
  return marker, tonumber(lease), ask, channel
end

-- Takes `member` out of the line.
local function leave_waiting(waiting, timeouts, member)
  redis.call('ZREM', waiting, member)
  redis.call('ZREM', timeouts, member)
end

-- Drops every request whose keep-alive deadline passed by `now`.
local function prune(waiting, timeouts, now)
  local stale = redis.call('ZRANGEBYSCORE', timeouts, '-inf', now)
  for _, member in ipairs(stale) do
    redis.call('ZREM', waiting, member)
  end
  if #stale > 0 then
    redis.call('ZREMRANGEBYSCORE', timeouts, '-inf', now)
  end
end

-- For a caller refused now: if it will wait (`keepalive` ms > 0), its request joins the line,
-- keeping an earlier place, and its deadline moves to now + keepalive. A caller that will not
-- wait (keep-alive 0: a single try, or the last try of a wait that ran out) leaves it instead, in
-- the same script, so nothing is granted to a call that has returned.
local function stay_in_line(waiting, timeouts, member, keepalive, now)
  keepalive = tonumber(keepalive)
  if keepalive > 0 then
    if not redis.call('ZSCORE', waiting, member) then
      local time = redis.call('TIME')
      redis.call('ZADD', waiting, tonumber(time[1]) * 1000000 + tonumber(time[2]), member)
    end
    redis.call('ZADD', timeouts, now + keepalive, member)
    extend(waiting, keepalive)
    extend(timeouts, keepalive)
  elseif redis.call('EXISTS', waiting) == 1 then
    leave_waiting(waiting, timeouts, member)
  end
end

-- Publishes `message` on `channel` (SPUBLISH when `sharded` = '1'); whether a subscriber got it
-- (pcall: a failed publish must not undo the script's other work; it counts as unheard).
-- `sharded` = '2' is classic PUBLISH on a cluster: the cluster bus carries the message to the
-- subscribers of every node, but PUBLISH counts only this node's, so the count says nothing and
-- every publish counts as heard (a grant nobody takes then lasts its probation).
local function heard(channel, sharded, message)
  local receivers
  if sharded == '1' then
    receivers = redis.pcall('SPUBLISH', channel, message)
  else
    receivers = redis.pcall('PUBLISH', channel, message)
  end
  if sharded == '2' then
    return type(receivers) == 'number'
  end
  return type(receivers) == 'number' and receivers > 0
end

-- The grant message of a hold: `g:<count>:<token>:<now>:<expiry>:<marker>` (lockkit_protocol::
-- wake::Grant; a semaphore's count is the permits granted, its token 0).
local function grant_message(count, token, now, expiry, marker)
  return string.format('g:%d:%d:%d:%d:', count, token, now, expiry) .. marker
end

-- Walks the line from its head (stale requests are dropped first): `serve(marker, lease, ask,
-- channel)` is called with the head and says 'next' (the head was granted, or dropped: it leaves
-- the line and the walk goes on), 'stop' (the head does not fit, or is the caller's own: it stays,
-- and the walk ends) or any other string (the head was served and nothing more fits: it leaves,
-- and the walk ends with that string). A malformed head is dropped. Returns the string that ended
-- the walk, or nil (the line is empty, or a head stopped it).
local function serve_line(waiting, timeouts, now, serve)
  if redis.call('EXISTS', waiting) == 0 then
    return nil
  end
  prune(waiting, timeouts, now)
  while true do
    local head = redis.call('ZRANGE', waiting, 0, 0)[1]
    if not head then
      return nil
    end
    local marker, lease, ask, channel = parse_request(head)
    local outcome = 'next'
    if marker then
      outcome = serve(marker, lease, ask, channel)
      if outcome == 'stop' then
        return nil
      end
    end
    leave_waiting(waiting, timeouts, head)
    if outcome ~= 'next' then
      return outcome
    end
  end
end

-- serve_line for a walk that may grant many requests (a semaphore's freed permits, a read-write
-- lock's readers): `grant(marker, lease, ask, channel)` says as serve's callback does, and when it
-- granted the head, also returns the grant's message and a function that takes the grant back.
-- After the walk, each client is told once, on its channel, with every grant made to its calls in
-- one message (one line each, lockkit_protocol::wake::Wake::decode_all); the grants of a channel
-- nobody heard are taken back, and the line is walked again (those requests left it, so what they
-- were granted goes to the next heads).
local function grant_line_told(waiting, timeouts, now, sharded, grant)
  while true do
    local told, order = {}, {}
    serve_line(waiting, timeouts, now, function(marker, lease, ask, channel)
      local outcome, message, undo = grant(marker, lease, ask, channel)
      if message then
        if not told[channel] then
          told[channel] = {messages = {}, undos = {}}
          order[#order + 1] = channel
        end
        table.insert(told[channel].messages, message)
        table.insert(told[channel].undos, undo)
      end
      return outcome
    end)
    local undone = false
    for _, channel in ipairs(order) do
      if not heard(channel, sharded, table.concat(told[channel].messages, '\n')) then
        for _, undo in ipairs(told[channel].undos) do
          undo()
        end
        undone = true
      end
    end
    if not undone then
      return
    end
  end
end

-- The request at the head of the line, or nil (stale requests are not looked at: call after a
-- serve_line, which pruned them).
local function head_of_line(waiting)
  return redis.call('ZRANGE', waiting, 0, 0)[1]
end
