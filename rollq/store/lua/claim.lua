-- Claim a batch of queued tasks, each for one attempt: count the claim, stamp its time, start the heartbeat clock.
-- Only the RQ job that currently stands for a task may claim it, so a stray or duplicated job runs nothing.
-- The heartbeat deadline is Redis's own time plus unresponsive_seconds, so clients' clocks do not matter.
-- Every number is checked before the first write of a task: Redis does not undo a script that fails part way.
-- A cancelled task is not queued, so its claim is refused as stale.
-- Also records the attempt in the task's history (claim_field(attempt) = worker|claim time; only the newest
-- HISTORY_LIMIT attempts are kept).
-- Redis's time and the latest resources version are read once for the batch (issue 24: one TIME, one GET and one
-- EVALSHA a batch of claims, not one each).
-- Returns one reply per task, in order: {'missing'} | {'stale', state} | {'invalid', reason} (nothing written; a
--   task key that holds no hash among them) |
--   {'claimed', attempt, task_json, policy_json, latest_resources_id|'', attempts_used, now, generation,
--    the damaged keys skipped ('' when none)} |
--   an error reply when its part failed (the other tasks' parts stand; see guarded in the header).
-- Keys of the namespace holding another type than rollq writes there are checked before the first write (Redis does
-- not undo a script that fails part way; see intact and require in the header). The in-flight set and the latest
-- resources pointer are essential: a claim marked its task running and then failed at the ZADD, leaving the task
-- running out of the in-flight set, where no reaper looks: never ended. Either one damaged refuses the whole call
-- with an error naming it, nothing written: every task stays queued, still waiting for its job. The worker fails
-- that RQ job with the error (it names the key); the lost-job sweep (store/reaper.py, lua/reissue.lua) finds the
-- queued task whose job is on none of RQ's lists and, unresponsive_seconds (at most 30 s) later, queues it again as
-- a new job: refused again while the key is damaged, claimed once it is repaired, so no task is lost.
-- A damaged queued-task index is skipped (its SREM) and named in each claimed reply for the worker to log.
-- (F, S, STATE, REPLY, member and the stats helpers come from the header rollq.store.scripts.lua_header() puts
-- before every script.)
local inflight = KEYS[1]
local resources_latest = KEYS[2]
local queued_tasks = KEYS[3]  -- the index of queued tasks (see enqueue.lua)
local task_keys = list_from(KEYS, 4)  -- one per task
local worker = ARGV[1]
local task_args = list_from(ARGV, 2)  -- per task: rollout_id, job_id

require(inflight, 'zset', 'in-flight set')
require(resources_latest, 'string', 'latest resources pointer')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')

local now, now_text, latest = nil, nil, nil
local unindexed = {}  -- claimed tasks' keys: out of the queued-task index in one SREM (issue 24)
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) + tonumber(time[2]) / 1000000
    now_text = tostring(now)
  end
  return now, now_text
end
local function latest_resources()
  if latest == nil then
    latest = redis.call('GET', resources_latest) or ''
  end
  return latest
end

local function claim_one(task_key, rollout_id, job_id)
  -- A task key holding another type than a hash (something other than rollq wrote it) is answered 'invalid',
  -- the key left as it is: a WRONGTYPE error here failed the job with Redis's raw words and published nothing.
  -- pcall, not a TYPE before every HMGET: the check costs nothing for a record that is a hash.
  local t = redis.pcall('HMGET', task_key, F.task, F.policy, F.state, F.job, F.unresponsive, F.worker, F.attempt,
    F.attempts, F.claims, F.generation)
  if is_wrong_type(t) then
    return {REPLY.invalid, foreign_key('task record', task_key, redis.call('TYPE', task_key).ok, 'hash')}
  elseif t.err then
    return t
  end
  if not t[1] then
    return {REPLY.missing}
  end
  local at, at_text = clock()
  local generation = tonumber(t[10]) or 1
  if t[3] == STATE.running and t[4] == job_id and t[6] == worker then
    -- This worker's own claim, sent again because a connection drop swallowed the reply.
    return {REPLY.claimed, tonumber(t[7]), t[1], t[2], latest_resources(), tonumber(t[8]), at_text, generation,
      damaged()}
  end
  if t[3] and t[4] == job_id and not is_state(t[3]) then
    -- A state rollq never writes, on the job that stands for the task: no other claim would ever run it.
    return {REPLY.invalid, F.state .. ' is ' .. t[3] .. ', not a task state'}
  end
  if t[3] ~= STATE.queued or t[4] ~= job_id then
    return {REPLY.stale, t[3] or ''}
  end
  local unresponsive = tonumber(t[5])
  if not unresponsive or unresponsive <= 0 then
    return {REPLY.invalid, F.unresponsive .. ' is ' .. tostring(t[5]) .. ', not a positive number'}
  end
  for _, i in ipairs({8, 9}) do
    if t[i] and not string.match(t[i], '^%d+$') then
      return {REPLY.invalid, (i == 8 and F.attempts or F.claims) .. ' is ' .. t[i] .. ', not a whole number'}
    end
  end
  -- Both counters were checked above: they are set in the one HSET (two HINCRBYs cost two more commands a claim).
  local attempt = (tonumber(t[9]) or 0) + 1
  local used = (tonumber(t[8]) or 0) + 1
  unindexed[#unindexed + 1] = task_key
  redis.call('HSET', task_key, F.state, STATE.running, F.attempt, attempt, F.claims, attempt, F.attempts, used,
    F.last_claim, at_text, F.worker, worker, claim_field(attempt), history(worker, at_text))
  if attempt > HISTORY_LIMIT then
    redis.call('HDEL', task_key, claim_field(attempt - HISTORY_LIMIT), end_field(attempt - HISTORY_LIMIT))
  end
  redis.call('ZADD', inflight, at + unresponsive, member(rollout_id, attempt))
  return {REPLY.claimed, attempt, t[1], t[2], latest_resources(), used, at_text, generation, damaged()}
end

local replies = {}
for i, task_key in ipairs(task_keys) do
  replies[i] = guarded(claim_one, task_key, task_args[2 * i - 1], task_args[2 * i])
end
if #unindexed > 0 and queued_ok then
  redis.call('SREM', queued_tasks, unpack(unindexed))
end
return replies
