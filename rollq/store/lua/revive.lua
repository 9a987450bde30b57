-- Take a task off the dead-letter set and queue it again with a fresh attempt budget and the next generation
-- (its rollouts say which run of the task they come from).
-- Returns 1 requeued ({1, the damaged keys skipped} when it skipped any), 0 not in the dead-letter set, -1 the new
-- job id holds a job hash that stands for something else (nothing written).
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

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header). The task record, the dead-letter set, the RQ queue and the new job's key are essential: one of another
-- type refuses the call naming it, nothing written, the task left dead-lettered (an HGET of a task key holding a
-- string failed after the ZREM from the dead-letter set; an RPUSH to an RQ queue holding one, after the task was
-- marked queued). A damaged queued-task index, RQ queue set or resources refs hash is skipped and named in the reply
-- (a SADD to a queued-task index holding a string failed before the job was written or pushed: the task was left
-- queued with no job, in no index for the lost-job sweep to find it by).
require(task_key, 'hash', 'task record')
require(dead_letter, 'zset', 'dead-letter set')
require(rq_queue, 'list', 'RQ queue')
require(new_job_key, 'hash', 'RQ job hash')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')
local queues_ok = intact(rq_queues, 'set', 'RQ queue set')
local refs_ok = intact(resources_refs, 'hash', 'resources refs hash')

if not redis.call('ZSCORE', dead_letter, rollout_id) then
  return 0
end
local taken = redis.call('HGET', new_job_key, 'data')
if taken and taken ~= job_fields[2] then
  return -1
end
redis.call('ZREM', dead_letter, rollout_id)
local rid = redis.call('HGET', task_key, F.resources_id)
if refs_ok and rid and rid ~= '' then
  count(resources_refs, rid, 1)
end
local generation = tonumber(redis.call('HGET', task_key, F.generation) or '1') + 1
redis.call('HSET', task_key, F.state, STATE.queued, F.job, new_job_id, F.attempts, 0, F.generation, generation)
if queued_ok then
  redis.call('SADD', queued_tasks, task_key)
end
redis.call('HDEL', task_key, F.result, F.ended)
redis.call('PERSIST', task_key)
redis.call('HSET', new_job_key, unpack(job_fields))
redis.call('RPUSH', rq_queue, new_job_id)
if queues_ok then
  redis.call('SADD', rq_queues, rq_queue)
end
return with_damaged(1)
