-- End the current attempt without an outcome and queue the task again as a new RQ job:
-- a retry after a failure, a requeue of an unresponsive attempt, or a hand-back on graceful stop.
-- KEYS: task, inflight, rq_queue, rq_queues, rq_job (new), stats
-- ARGV: rollout_id, attempt, new_job_id, reason, stale_before|'', at_front(0|1), job hash field/value pairs...
-- Returns 'requeued'; 'superseded' when the attempt is not current; 'alive' when stale_before is set and the
-- attempt heartbeated after it.
local running = member(ARGV[1], ARGV[2])
local t = redis.call('HMGET', KEYS[1], F.state, F.attempt)
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'superseded'
end
if ARGV[5] ~= '' then
  local deadline = redis.call('ZSCORE', KEYS[2], running)
  if deadline and tonumber(deadline) > tonumber(ARGV[5]) then
    return 'alive'
  end
end
redis.call('ZREM', KEYS[2], running)
redis.call('HSET', KEYS[1], F.state, 'queued', F.job, ARGV[3])
if ARGV[4] == 'released' then
  redis.call('HINCRBY', KEYS[1], F.attempts, -1)
end
redis.call('HINCRBY', KEYS[6], requeue_stat(ARGV[4]), 1)
redis.call('HSET', KEYS[5], unpack(ARGV, 7))
if ARGV[6] == '1' then
  redis.call('LPUSH', KEYS[3], ARGV[3])
else
  redis.call('RPUSH', KEYS[3], ARGV[3])
end
redis.call('SADD', KEYS[4], KEYS[3])
return 'requeued'
