-- End the current attempt without an outcome and queue the task again as a new RQ job:
-- a retry after a failure, a requeue of an unresponsive attempt, or a hand-back on graceful stop.
-- Nothing is written when the new job id holds a job hash that stands for something else.
-- KEYS: task, inflight, rq_queue, rq_queues, rq_job (new), stats
-- ARGV: rollout_id, attempt, new_job_id, reason, stale_before|'', at_front(0|1), job hash field/value pairs...
--       (the first pair is 'data', payload)
-- Records the attempt's end in the task's history (end_field(attempt) = reason|server time).
-- Returns 'requeued'; 'superseded' when the attempt is not current; 'alive' when stale_before is set and the
-- attempt heartbeated after it; 'conflict' when the new job id is taken by another job.
local running = member(ARGV[1], ARGV[2])
local t = redis.call('HMGET', KEYS[1], F.state, F.attempt, F.attempts)
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'superseded'
end
if ARGV[5] ~= '' then
  local deadline = redis.call('ZSCORE', KEYS[2], running)
  if deadline and tonumber(deadline) > tonumber(ARGV[5]) then
    return 'alive'
  end
end
local taken = redis.call('HGET', KEYS[5], 'data')
if taken and taken ~= ARGV[8] then
  return 'conflict'
end
redis.call('ZREM', KEYS[2], running)
local clock = redis.call('TIME')
redis.call('HSET', KEYS[1], F.state, 'queued', F.job, ARGV[3],
  end_field(ARGV[2]), history(ARGV[4], clock[1] .. '.' .. string.format('%06d', clock[2])))
if ARGV[4] == 'released' and t[3] and string.match(t[3], '^%d+$') then
  redis.call('HINCRBY', KEYS[1], F.attempts, -1)
end
count(KEYS[6], requeue_stat(ARGV[4]), 1)
redis.call('HSET', KEYS[5], unpack(ARGV, 7))
if ARGV[6] == '1' then
  redis.call('LPUSH', KEYS[3], ARGV[3])
else
  redis.call('RPUSH', KEYS[3], ARGV[3])
end
redis.call('SADD', KEYS[4], KEYS[3])
return 'requeued'
