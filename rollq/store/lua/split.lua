-- Split a pack (an RQ job of several tasks, tasks_per_job > 1) that a consumer of single-task jobs took off the queue
-- into RQ's intermediate list (the Agent Lightning 0.1 gateway), or that still waits on the queue for a task AL 1.0's
-- runners claim by its id (taken_from is then the queue itself): each of its tasks that still waits for it is
-- queued again as a job of its own at the front of the queue, in the pack's order, and the pack's job is dropped.
-- The new jobs are built as requeue.lua's and reissue.lua's are (the caller's job template); the task stays queued,
-- its record names its new job, so only that job may claim it. All or nothing: nothing is written when a new job id
-- holds a job hash that stands for something else, or when the pack is no longer on taken_from (a reaper put it
-- back, or a worker took it: the next taker splits it, or the worker runs it).
-- Returns the number of tasks queued again ({n, the damaged keys skipped} when it skipped any; 0: none waited, the
-- pack was a leftover and is dropped); -1 a new job id is taken; -2 the pack was not on taken_from.
local taken_from = KEYS[1]  -- the list the pack is on: RQ's intermediate list, or the queue
local rq_queue = KEYS[2]
local rq_queues = KEYS[3]
local pack_job_key = KEYS[4]
local stats = KEYS[5]
local task_keys = list_from(KEYS, 6)  -- per task, in the pack's order: task, new rq_job
local pack_job_id = ARGV[1]
local template_size = tonumber(ARGV[2])
local template = list_from(ARGV, 3, 2 + template_size)  -- job hash field/value items every new job shares
local task_args = list_from(ARGV, 3 + template_size)  -- per task: new job id, job payload, job description

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header): a list the pack is taken from or an RQ queue of another type refuses the call naming it, nothing written
-- (an LPUSH that failed after the pack was dropped left the new job on none of RQ's lists). A damaged RQ queue set
-- or stats hash is skipped and named in the reply.
require(taken_from, 'list', 'RQ list the pack is on')
require(rq_queue, 'list', 'RQ queue')
local queues_ok = intact(rq_queues, 'set', 'RQ queue set')
local stats_ok = intact(stats, 'hash', 'stats hash')

local waiting = {}
for i = 1, #task_keys / 2 do
  local t = redis.call('HMGET', task_keys[2 * i - 1], F.state, F.job)
  if t[1] == STATE.queued and t[2] == pack_job_id then
    local taken = redis.call('HGET', task_keys[2 * i], 'data')
    if taken and taken ~= task_args[3 * i - 1] then
      return -1
    end
    waiting[#waiting + 1] = i
  end
end
if redis.call('LREM', taken_from, 1, pack_job_id) == 0 then
  return -2
end
redis.call('DEL', pack_job_key)
-- Pushed last task first, so that the pack's first task is at the front.
for w = #waiting, 1, -1 do
  local i = waiting[w]
  local job_id, payload, description = task_args[3 * i - 2], task_args[3 * i - 1], task_args[3 * i]
  redis.call('HSET', task_keys[2 * i - 1], F.job, job_id)
  redis.call('HSET', task_keys[2 * i], 'data', payload, 'description', description, unpack(template))
  redis.call('LPUSH', rq_queue, job_id)
end
if #waiting > 0 and queues_ok then
  redis.call('SADD', rq_queues, rq_queue)
end
if #waiting > 0 and stats_ok then
  count(stats, requeue_stat('split'), #waiting)
end
return with_damaged(#waiting)
