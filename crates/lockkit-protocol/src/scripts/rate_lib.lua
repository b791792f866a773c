-- rate_lib: helpers of the rate limiter's scripts (GCRA with reservations: see rate_limiter.rs).

-- The server's clock, in microseconds.
local function rate_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The stored limit of KEYS[1]: rate, interval (ms), burst and mode, or nil when none is set.
-- A limit that cannot be read is an error (someone else's data under lockkit's key).
local function rate_limit(key)
  local cfg = redis.call('HMGET', key, 'rate', 'interval', 'burst', 'mode')
  if not cfg[1] then
    return nil
  end
  local rate, interval, burst = tonumber(cfg[1]), tonumber(cfg[2]), tonumber(cfg[3])
  if not (rate and interval and burst) or rate < 1 or interval < 1 or burst < 0 then
    return redis.error_reply('WRONGTYPE the rate limiter key holds a limit lockkit cannot read')
  end
  return {rate = rate, interval = interval, burst = burst, mode = cfg[4] or 'overall'}
end

-- The emission interval (µs between two permits) of a limit.
local function rate_emission(limit)
  return limit.interval * 1000 / limit.rate
end

-- A number stored so that it reads back exactly.
local function rate_fmt(x)
  return string.format('%.17g', x)
end
