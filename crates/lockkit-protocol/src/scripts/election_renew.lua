-- election_renew: the watchdog's renewal of leaderships, lock_renew's on the election's keys,
-- with each leader record's lifetime following its hold.
--
-- KEYS         the keys of each hold, `stride` keys per hold (stride = #KEYS / (#ARGV / 2)): the
--              first of each hold's keys is the election's main key (the fenced hold HASH), the
--              last its leader record (see election_lib.lua); the others are not touched
-- ARGV[2i-1]   hold marker of the i-th hold
-- ARGV[2i]     lease in ms to extend the i-th hold to (now + lease), or `@<server ms>`: to that
--              instant (a granted hold's confirmation); 0 = only check that the hold is there
--
-- Reply        as lock_renew: one integer per hold, 1 = the hold is live (and was extended),
--              0 = the hold is gone
--
-- The hold is renewed as lock_renew renews it (hold_lib.lua, renew_hold). Then, when the record
-- names this hold (its marker), the record expires with the hold: PEXPIREAT the hold's own
-- expiry, so the record lives exactly as long as the leadership it names. A record of another
-- hold is not touched.
local holds = #ARGV / 2
local stride = #KEYS / holds
local now = now_ms()
local result = {}
for i = 1, holds do
  local key, record = KEYS[stride * (i - 1) + 1], KEYS[stride * i]
  local marker = ARGV[2 * i - 1]
  result[i] = renew_hold(key, marker, ARGV[2 * i], now)
  if result[i] == 1 then
    follow_hold(key, record, marker, now)
  end
end
return result
