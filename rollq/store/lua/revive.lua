-- Take a task off the dead-letter set and queue it again with a fresh attempt budget and the next generation
-- (its rollouts say which run of the task they come from).
-- KEYS: task, dead_letter, rq_queue, rq_queues, rq_job (new), resources_refs
-- ARGV: rollout_id, new_job_id, job hash field/value pairs...
-- Returns 1 requeued, 0 not in the dead-letter set, -1 the new job id holds a job hash that stands for something
-- else (nothing written).
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
local taken = redis.call('HGET', KEYS[5], 'data')
if taken and taken ~= ARGV[4] then
  return -1
end
redis.call('ZREM', KEYS[2], ARGV[1])
local rid = redis.call('HGET', KEYS[1], F.resources_id)
if rid and rid ~= '' then
  count(KEYS[6], rid, 1)
end
local generation = tonumber(redis.call('HGET', KEYS[1], F.generation) or '1') + 1
redis.call('HSET', KEYS[1], F.state, 'queued', F.job, ARGV[2], F.attempts, 0, F.generation, generation)
redis.call('HDEL', KEYS[1], F.result, F.ended)
redis.call('PERSIST', KEYS[1])
redis.call('HSET', KEYS[5], unpack(ARGV, 3))
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('SADD', KEYS[4], KEYS[3])
return 1
