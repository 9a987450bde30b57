-- Queue again a task whose RQ job vanished: deleted (rq-dashboard's Delete or Empty buttons, `rq empty`) or left
-- on none of RQ's lists (a flushed list). A vanished job hash is acted on at once: nothing in rollq deletes the hash
-- of a job its task still waits for. A job hash on none of the lists is only marked on the first sighting and acted
-- on when a later pass, unresponsive_seconds (at most 30 s) on, finds it still so: a worker between RQ's lists could
-- otherwise be raced.
-- The list check (two LPOS, linear in the lists' length) runs only when `deep` is 1: the caller bounds how many
-- it asks for.
-- Returns 1 queued again ({1, the damaged keys skipped} when it skipped any), 0 not (or not yet), -1 the new job id
-- holds a job hash that stands for something else.
local task_key = KEYS[1]
local rq_queue = KEYS[2]
local rq_intermediate = KEYS[3]
local rq_queues = KEYS[4]
local old_job_key = KEYS[5]
local new_job_key = KEYS[6]
local marker = KEYS[7]  -- when a pass first saw the old job on none of RQ's lists
local stats = KEYS[8]
local old_job_id = ARGV[1]
local new_job_id = ARGV[2]
local now = ARGV[3]
local deep = ARGV[4] == '1'
local job_fields = list_from(ARGV, 5)  -- the new job hash's field/value pairs, 'data' and its payload first

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header): an RQ queue or new job key of another type refuses the call naming it, nothing written (an RPUSH that
-- failed after the task was pointed at its new job left that job on none of RQ's lists); the task stays queued for
-- a later pass once the key is repaired. A damaged RQ queue set or stats hash is skipped and named in the reply.
require(rq_queue, 'list', 'RQ queue')
require(new_job_key, 'hash', 'RQ job hash')
local queues_ok = intact(rq_queues, 'set', 'RQ queue set')
local stats_ok = intact(stats, 'hash', 'stats hash')

local t = redis.call('HMGET', task_key, F.state, F.job, F.unresponsive)
if t[1] ~= STATE.queued or t[2] ~= old_job_id then
  redis.call('DEL', marker)
  return 0
end
if redis.call('EXISTS', old_job_key) == 1 then
  if not deep then
    return 0
  end
  if redis.call('LPOS', rq_queue, old_job_id) or redis.call('LPOS', rq_intermediate, old_job_id) then
    redis.call('DEL', marker)
    return 0
  end
  local seen = tonumber(redis.call('GET', marker))
  if not seen then
    redis.call('SET', marker, now, 'EX', 600)
    return 0
  end
  if tonumber(now) - seen < math.min(tonumber(t[3]) or 30, 30) then
    return 0
  end
end
local taken = redis.call('HGET', new_job_key, 'data')
if taken and taken ~= job_fields[2] then
  return -1
end
redis.call('DEL', marker)
redis.call('HSET', task_key, F.job, new_job_id)
redis.call('HSET', new_job_key, unpack(job_fields))
redis.call('RPUSH', rq_queue, new_job_id)
if queues_ok then
  redis.call('SADD', rq_queues, rq_queue)
end
if stats_ok then
  count(stats, requeue_stat('vanished'), 1)
end
return with_damaged(1)
