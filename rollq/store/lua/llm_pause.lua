-- Pause the namespace's LLM calls for a weight sync: workers' capturing proxies start no new upstream call
-- once they see the pause: at once when they listen on the gate's channel ('pause|<epoch>'), else at their
-- next heartbeat (see llm_report.lua).
-- A pause while paused keeps its epoch (the workers' acknowledgements still count) and renews the lease.
-- Returns {epoch, now} as strings.
local pause_key, gate_key = KEYS[1], KEYS[2]
local lease_ms, channel = tonumber(ARGV[1]) or 0, ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local epoch = redis.call('GET', pause_key)
local new = not epoch
if new then
  epoch = tostring(redis.call('HINCRBY', gate_key, 'epoch', 1))
  redis.call('HSET', gate_key, 'paused_at', tostring(now))
end
if lease_ms > 0 then
  redis.call('SET', pause_key, epoch, 'PX', lease_ms)
else
  redis.call('SET', pause_key, epoch)
end
if new then
  redis.call('PUBLISH', channel, 'pause|' .. epoch)
end
return {epoch, tostring(now)}
