-- One worker's report to the LLM gate (piggybacked on its heartbeat): the pause epoch its proxy has closed its
-- gate for, its LLM calls running upstream and waiting at the gate.
-- ARGV[6] '1': write the report even if the worker's entry is there (the worker does not know that it holds this
-- report: it changed, or an earlier one's reply was lost or overlapped another's); else it is written only when
-- the worker's entry had expired and been swept. ARGV[7] '1': also drop the reports of workers that stopped
-- reporting (a bounded number; each worker asks on one report in several, so an idle fleet costs three commands a
-- report: TIME, ZADD, MGET).
-- Returns {paused epoch or '', latest resources id or ''}.
local workers_key, calls_key, pause_key, latest_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, ack, in_flight, waiting = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl = tonumber(ARGV[5])
local write, sweep = ARGV[6] == '1', ARGV[7] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local new = redis.call('ZADD', workers_key, now + ttl, worker) == 1
if write or new then
  redis.call('HSET', calls_key, worker, ack .. '|' .. in_flight .. '|' .. waiting)
end
if sweep then
  local gone = redis.call('ZRANGEBYSCORE', workers_key, '-inf', now, 'LIMIT', 0, 100)
  if #gone > 0 then
    redis.call('ZREM', workers_key, unpack(gone))
    redis.call('HDEL', calls_key, unpack(gone))
  end
end
local state = redis.call('MGET', pause_key, latest_key)
return {state[1] or '', state[2] or ''}
