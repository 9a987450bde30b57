-- End the current attempt without an outcome and queue the task again as a new RQ job:
-- a retry after a failure, a requeue of an unresponsive attempt, or a hand-back on graceful stop.
-- Nothing is written when the new job id holds a job hash that stands for something else.
-- Records the attempt's end in the task's history (end_field(attempt) = reason|server time).
-- Returns 'requeued' ({'requeued', the damaged keys skipped} when it skipped any); 'missing' when the task record is
-- gone (Redis lost it: a restart without persistence, a flush, an eviction); 'superseded' when the attempt is not
-- current; 'alive' when stale_before is set and the attempt heartbeated after it; 'conflict' when the new job id is
-- taken by another job.
local task_key = KEYS[1]
local inflight = KEYS[2]
local rq_queue = KEYS[3]
local rq_queues = KEYS[4]
local new_job_key = KEYS[5]
local stats = KEYS[6]
local queued_tasks = KEYS[7]  -- the index of queued tasks (see enqueue.lua)
local rollout_id = ARGV[1]
local attempt = ARGV[2]  -- a string, as the task record holds it
local new_job_id = ARGV[3]
local reason = ARGV[4]  -- retry | unresponsive | released (a hand-back gives the attempt back)
local stale_before = ARGV[5]  -- '' unless a reaper requeues the attempt
local at_front = ARGV[6] == '1'
local job_fields = list_from(ARGV, 7)  -- the new job hash's field/value pairs, 'data' and its payload first

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header). The RQ queue and the new job's key are essential: either of another type refuses the call naming it,
-- nothing written, the attempt left in flight for a reaper to requeue once the key is repaired (an RPUSH that failed
-- after the task was marked queued left its new job on none of RQ's lists). A damaged in-flight set, queued-task
-- index, RQ queue set or stats hash is skipped and named in the reply (a SADD to a queued-task index holding a string
-- failed after the ZREM: the task was left running out of the in-flight set, where no reaper looks, never ended).
require(rq_queue, 'list', 'RQ queue')
require(new_job_key, 'hash', 'RQ job hash')
local inflight_ok = intact(inflight, 'zset', 'in-flight set')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')
local queues_ok = intact(rq_queues, 'set', 'RQ queue set')
local stats_ok = intact(stats, 'hash', 'stats hash')

local running = member(rollout_id, attempt)
local t = redis.call('HMGET', task_key, F.state, F.attempt, F.attempts)
if t[1] == false and redis.call('EXISTS', task_key) == 0 then
  return REPLY.missing  -- no newer attempt: Redis lost the record (as finish.lua's 'missing'); nothing written
end
if t[1] ~= STATE.running or t[2] ~= attempt then
  return REPLY.superseded
end
if stale_before ~= '' and inflight_ok then
  local deadline = redis.call('ZSCORE', inflight, running)
  if deadline and tonumber(deadline) > tonumber(stale_before) then
    return REPLY.alive
  end
end
local taken = redis.call('HGET', new_job_key, 'data')
if taken and taken ~= job_fields[2] then
  return REPLY.conflict
end
if inflight_ok then
  redis.call('ZREM', inflight, running)
end
local clock = redis.call('TIME')
if queued_ok then
  redis.call('SADD', queued_tasks, task_key)
end
redis.call('HSET', task_key, F.state, STATE.queued, F.job, new_job_id,
  end_field(attempt), history(reason, clock[1] .. '.' .. string.format('%06d', clock[2])))
if reason == 'released' and t[3] and string.match(t[3], '^%d+$') then
  redis.call('HINCRBY', task_key, F.attempts, -1)
end
if stats_ok then
  count(stats, requeue_stat(reason), 1)
end
redis.call('HSET', new_job_key, unpack(job_fields))
if at_front then
  redis.call('LPUSH', rq_queue, new_job_id)
else
  redis.call('RPUSH', rq_queue, new_job_id)
end
if queues_ok then
  redis.call('SADD', rq_queues, rq_queue)
end
return with_damaged(REPLY.requeued)
