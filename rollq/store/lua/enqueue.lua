-- Queue a batch of new tasks that share a mode, a resources pin and a policy. Each task is queued once:
-- its record, its RQ job and the queue push happen together or not at all; a known rollout id is skipped.
-- Returns one word per task, 'queued', 'known', or 'job_taken' (nothing written for that task: its job id holds a
-- job hash that stands for something else, or a key of another type), then the damaged keys skipped if any; or
-- 'unknown_resources' for the whole batch when the pinned resources version does not exist (then nothing is written).
local rq_queue = KEYS[1]
local rq_queues = KEYS[2]
local resources_refs = KEYS[3]
local resources_version = KEYS[4]  -- rq_queue again when unpinned
local queued_tasks = KEYS[5]  -- the index of queued tasks' record keys (the lost-job sweep walks it)
local task_keys = list_from(KEYS, 6)  -- per task: task, rq_job
local policy_json = ARGV[1]
local unresponsive_seconds = ARGV[2]
local pinned = ARGV[3]  -- the resources version id, '' when unpinned
local mode = ARGV[4]  -- '' for none
local template_size = tonumber(ARGV[5])
local template = list_from(ARGV, 6, 5 + template_size)  -- job hash field/value items every task's job shares
local task_args = list_from(ARGV, 6 + template_size)  -- per task: task_json, job_id, job payload, job description

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header): an RQ queue of another type refuses the call naming it, nothing written (its RPUSH came last: the tasks
-- were written and indexed with their jobs on none of RQ's lists). A damaged queued-task index, RQ queue set or
-- resources refs hash is skipped and named after the codes (a SADD to an index holding a string failed after the
-- records and jobs were written: never pushed, and enqueueing them again answered 'known', so they never ran).
require(rq_queue, 'list', 'RQ queue')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')
local queues_ok = intact(rq_queues, 'set', 'RQ queue set')
local refs_ok = pinned == '' or intact(resources_refs, 'hash', 'resources refs hash')

if pinned ~= '' and redis.call('EXISTS', resources_version) == 0 then
  return ENQUEUED.unknown_resources
end
-- A pack (tasks_per_job > 1) lists the same job for each of its tasks, in a row: its job is written and pushed
-- once, with its first task that is queued; a pack never spans two calls (rollq.store.transitions).
local codes, pushed, written, indexed = {}, {}, {}, {}
for i = 1, #task_keys / 2 do
  local task_key, job_key = task_keys[2 * i - 1], task_keys[2 * i]
  local a = 4 * (i - 1)
  local task_json, job_id, payload, description = task_args[a + 1], task_args[a + 2], task_args[a + 3], task_args[a + 4]
  -- One EXISTS of both keys answers the usual case, a new task with a fresh job id (issue 24: one command, where an
  -- EXISTS of the task and an HGET of the job were two); only when either exists are they looked at one by one.
  local held = nil
  local fresh, known
  if written[job_id] then
    known = redis.call('EXISTS', task_key) == 1
    fresh = not known
  else
    fresh = redis.call('EXISTS', task_key, job_key) == 0
    if not fresh then
      -- A job key holding another type (something other than RQ wrote it) stands for something else too: the task
      -- is answered job_taken before anything of it is written (an HGET error here came after the batch's earlier
      -- tasks were written, and before they were pushed or indexed).
      held = redis.pcall('HGET', job_key, 'data')
      if is_wrong_type(held) then
        held = {}
      elseif type(held) == 'table' and held.err then
        return held
      end
      known = redis.call('EXISTS', task_key) == 1
    end
  end
  if not fresh and known then
    codes[i] = ENQUEUED.known
  elseif held and (type(held) == 'table' or held ~= payload) then
    codes[i] = ENQUEUED.job_taken
  else
    redis.call('HSET', task_key, F.task, task_json, F.policy, policy_json, F.unresponsive, unresponsive_seconds,
      F.job, job_id, F.resources_id, pinned, F.mode, mode, F.state, STATE.queued, F.claims, 0, F.attempts, 0)
    if not written[job_id] then
      redis.call('HSET', job_key, 'data', payload, 'description', description, unpack(template))
      pushed[#pushed + 1] = job_id
      written[job_id] = true
    end
    if pinned ~= '' and refs_ok then
      count(resources_refs, pinned, 1)
    end
    indexed[#indexed + 1] = task_key
    codes[i] = ENQUEUED.queued
  end
end
if #pushed > 0 then
  -- One SADD of the call's queued tasks, as one RPUSH of its jobs (issue 24: a command a task less).
  if queued_ok then
    redis.call('SADD', queued_tasks, unpack(indexed))
  end
  redis.call('RPUSH', rq_queue, unpack(pushed))
  if queues_ok then
    redis.call('SADD', rq_queues, rq_queue)
  end
end
if #DAMAGED > 0 then
  codes[#codes + 1] = damaged()
end
return codes
