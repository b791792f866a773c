-- fair_lib: the fair lock's queue, put in front of its scripts at compile time (see fair_lock.rs).
--   queue     a LIST of waiter ids (`<client id>:w<sequence>`) in request order; the head is next
--   timeouts  a ZSET waiter id -> keep-alive deadline (server ms)

-- Drops the waiters at the head of `queue` whose deadline passed by `now` (they died or gave up),
-- stopping at `keep` (a waiter running this script is alive). Returns the head left (nil: none)
-- and whether any was dropped.
local function drop_stale_heads(queue, timeouts, now, keep)
  local dropped = false
  local head = redis.call('LINDEX', queue, 0)
  while head and head ~= keep do
    local deadline = redis.call('ZSCORE', timeouts, head)
    if deadline and tonumber(deadline) > now then
      break
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', timeouts, head)
    dropped = true
    head = redis.call('LINDEX', queue, 0)
  end
  return head, dropped
end

-- Tells the waiter `head` that its turn came (`w:<head>`): on its own client's channel for this
-- lock, `<channel>:<client id>` (the client id is what precedes `:w` in the waiter id), so no
-- other client hears it. SPUBLISH when `sharded` = '1'.
local function name_next(channel, sharded, head)
  local client = string.match(head, '^(.*):w%d+$') or head
  local target = channel .. ':' .. client
  if sharded == '1' then
    redis.pcall('SPUBLISH', target, 'w:' .. head)
  else
    redis.pcall('PUBLISH', target, 'w:' .. head)
  end
end
