-- Heartbeat running attempts and keep the namespace's clock, on Redis's own time.
-- Each deadline is Redis's time when the heartbeat arrives plus the attempt's unresponsive_seconds, so a heartbeat
-- that waited in a socket while Redis was stalled still counts in full.
-- The clock notices stalls and outages: every caller promises its next call within `within` seconds; when a call
-- finds every promise broken by more than a second (Redis was stopped, restarted or out of reach of all clients),
-- reaping waits for the longest promised interval plus a second, so that the workers' first heartbeats after the
-- stall land before any reaper judges a deadline; the broken promise is spent then, so one stall (or the death of every
-- caller that promised, which the clock cannot tell from one) holds reaping off once. With no attempt in flight there is no deadline to misjudge (a
-- fleet that stopped cleanly and started again broke its promises too): no wait.
-- Returns {now, grace_until|''} as strings (and the damaged keys skipped, if any).
local inflight = KEYS[1]
local clock = KEYS[2]
local within = tonumber(ARGV[1]) or 0  -- seconds; 0 = no promise
-- member, unresponsive_seconds pairs (ZADD XX: never re-adds an attempt that finished or was taken over)
local attempts = list_from(ARGV, 2)

-- An in-flight set of another type is checked before the first write (the clock's HSET came before the ZADD that
-- failed on it): it is skipped, no deadline read or moved (it can hold none), and named in the reply for the caller
-- to log; the clock is kept all the same, so that reaping (its sweeps of RQ's lists among it) goes on.
local inflight_ok = intact(inflight, 'zset', 'in-flight set')

local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local c = redis.call('HMGET', clock, 'due', 'grace_until', 'longest')
local due, grace_until = tonumber(c[1]), tonumber(c[2])
local longest = math.max(tonumber(c[3]) or 0, within)
if due and now > due + 1 and inflight_ok and redis.call('ZCARD', inflight) > 0 then
  grace_until = now + longest + 1
  -- One grace per broken promise: the promise is spent here. Kept, a caller that promises nothing (Producer.reap)
  -- found it broken at every call once every worker was gone, and no deadline was ever judged.
  due = nil
  redis.call('HSET', clock, 'grace_until', tostring(grace_until))
  redis.call('HDEL', clock, 'due')
end
if within > 0 then
  redis.call('HSET', clock, 'due', tostring(math.max(due or 0, now + within)), 'longest', tostring(longest))
  redis.call('EXPIRE', clock, 3600)
end
for i = 1, #attempts - 1, 2 do
  local unresponsive = tonumber(attempts[i + 1])
  if unresponsive and inflight_ok then
    redis.call('ZADD', inflight, 'XX', now + unresponsive, attempts[i])
  end
end
local reply = {tostring(now), grace_until and tostring(grace_until) or ''}
if #DAMAGED > 0 then
  reply[3] = damaged()
end
return reply
