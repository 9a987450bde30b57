-- Queue a batch of new tasks that share a mode, a resources pin and a policy. Each task is queued once:
-- its record, its RQ job and the queue push happen together or not at all; a known rollout id is skipped.
-- KEYS: rq_queue, rq_queues, resources_refs, resources_version (rq_queue again when unpinned),
--       then per task: task, rq_job
-- ARGV: policy_json, unresponsive_seconds, resources_id|'', mode|'', n, n job-template field/value items,
--       then per task: task_json, job_id, job payload, job description
-- Returns one word per task, 'queued', 'known', or 'job_taken' (nothing written for that task: its job id holds a
-- job hash that stands for something else); or 'unknown_resources' for the whole batch when the pinned resources
-- version does not exist (then nothing is written).
local pinned = ARGV[3]
if pinned ~= '' and redis.call('EXISTS', KEYS[4]) == 0 then
  return 'unknown_resources'
end
local n = tonumber(ARGV[5])
local template = {unpack(ARGV, 6, 5 + n)}
local first = 6 + n
local codes, pushed = {}, {}
for i = 1, (#KEYS - 4) / 2 do
  local task_key, job_key = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local a = first + 4 * (i - 1)
  local held = redis.call('HGET', job_key, 'data')
  if redis.call('EXISTS', task_key) == 1 then
    codes[i] = 'known'
  elseif held and held ~= ARGV[a + 2] then
    codes[i] = 'job_taken'
  else
    redis.call('HSET', task_key, F.task, ARGV[a], F.policy, ARGV[1], F.unresponsive, ARGV[2], F.job, ARGV[a + 1],
      F.resources_id, pinned, F.mode, ARGV[4], F.state, 'queued', F.claims, 0, F.attempts, 0)
    redis.call('HSET', job_key, 'data', ARGV[a + 2], 'description', ARGV[a + 3], unpack(template))
    if pinned ~= '' then
      count(KEYS[3], pinned, 1)
    end
    pushed[#pushed + 1] = ARGV[a + 1]
    codes[i] = 'queued'
  end
end
if #pushed > 0 then
  redis.call('RPUSH', KEYS[1], unpack(pushed))
  redis.call('SADD', KEYS[2], KEYS[1])
end
return codes
