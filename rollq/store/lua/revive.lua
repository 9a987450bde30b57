-- Take a task off the dead-letter set and queue it again with a fresh attempt budget and the next generation
-- (its rollouts say which run of the task they come from).
-- Returns 1 requeued, 0 not in the dead-letter set, -1 the new job id holds a job hash that stands for something
-- else (nothing written).
local task_key = KEYS[1]
local dead_letter = KEYS[2]
local rq_queue = KEYS[3]
local rq_queues = KEYS[4]
local new_job_key = KEYS[5]
local resources_refs = KEYS[6]
local queued_tasks = KEYS[7]  -- the index of queued tasks (see enqueue.lua)
local rollout_id = ARGV[1]
local new_job_id = ARGV[2]
local job_fields = list_from(ARGV, 3)  -- the new job hash's field/value pairs, 'data' and its payload first

if not redis.call('ZSCORE', dead_letter, rollout_id) then
  return 0
end
local taken = redis.call('HGET', new_job_key, 'data')
if taken and taken ~= job_fields[2] then
  return -1
end
redis.call('ZREM', dead_letter, rollout_id)
local rid = redis.call('HGET', task_key, F.resources_id)
if rid and rid ~= '' then
  count(resources_refs, rid, 1)
end
local generation = tonumber(redis.call('HGET', task_key, F.generation) or '1') + 1
redis.call('HSET', task_key, F.state, STATE.queued, F.job, new_job_id, F.attempts, 0, F.generation, generation)
redis.call('SADD', queued_tasks, task_key)
redis.call('HDEL', task_key, F.result, F.ended)
redis.call('PERSIST', task_key)
redis.call('HSET', new_job_key, unpack(job_fields))
redis.call('RPUSH', rq_queue, new_job_id)
redis.call('SADD', rq_queues, rq_queue)
return 1
