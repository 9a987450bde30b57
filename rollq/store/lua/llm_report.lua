-- One worker's report to the LLM gate (piggybacked on its heartbeat): the pause epoch its proxy has closed its
-- gate for, its LLM calls running upstream and waiting at the gate. Drops the reports of workers that stopped
-- reporting (a bounded number per call).
-- Returns {paused epoch or '', latest resources id or ''}.
local workers_key, calls_key, pause_key, latest_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, ack, in_flight, waiting = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', workers_key, now + ttl, worker)
redis.call('HSET', calls_key, worker, ack .. '|' .. in_flight .. '|' .. waiting)
local gone = redis.call('ZRANGEBYSCORE', workers_key, '-inf', now, 'LIMIT', 0, 100)
if #gone > 0 then
  redis.call('ZREM', workers_key, unpack(gone))
  redis.call('HDEL', calls_key, unpack(gone))
end
return {redis.call('GET', pause_key) or '', redis.call('GET', latest_key) or ''}
