-- Claim a queued task for one attempt: count the claim, stamp its time, start the heartbeat clock.
-- Only the RQ job that currently stands for the task may claim it, so a stray or duplicated job runs nothing.
-- The heartbeat deadline is Redis's own time plus unresponsive_seconds, so clients' clocks do not matter.
-- Every number is checked before the first write: Redis does not undo a script that fails part way.
-- A cancelled task is not queued, so its claim is refused as stale.
-- Also records the attempt in the task's history (claim_field(attempt) = worker|claim time; only the newest
-- HISTORY_LIMIT attempts are kept).
-- Returns {'missing'} | {'stale', state} | {'invalid', reason} (nothing written) |
--         {'claimed', attempt, task_json, policy_json, latest_resources_id|'', attempts_used, now, generation}
-- (F, S, STATE, REPLY, member and the stats helpers come from the header rollq.store.scripts.lua_header() puts
-- before every script.)
local task_key = KEYS[1]
local inflight = KEYS[2]
local resources_latest = KEYS[3]
local queued_tasks = KEYS[4]  -- the index of queued tasks (see enqueue.lua)
local rollout_id = ARGV[1]
local job_id = ARGV[2]
local worker = ARGV[3]

local t = redis.call('HMGET', task_key, F.task, F.policy, F.state, F.job, F.unresponsive, F.worker, F.attempt,
  F.attempts, F.claims, F.generation)
if not t[1] then
  return {REPLY.missing}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local generation = tonumber(t[10]) or 1
if t[3] == STATE.running and t[4] == job_id and t[6] == worker then
  -- This worker's own claim, sent again because a connection drop swallowed the reply.
  return {REPLY.claimed, tonumber(t[7]), t[1], t[2], redis.call('GET', resources_latest) or '', tonumber(t[8]),
    tostring(now), generation}
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
redis.call('SREM', queued_tasks, task_key)
redis.call('HSET', task_key, F.state, STATE.running, F.attempt, attempt, F.claims, attempt, F.attempts, used,
  F.last_claim, tostring(now), F.worker, worker, claim_field(attempt), history(worker, tostring(now)))
if attempt > HISTORY_LIMIT then
  redis.call('HDEL', task_key, claim_field(attempt - HISTORY_LIMIT), end_field(attempt - HISTORY_LIMIT))
end
redis.call('ZADD', inflight, now + unresponsive, member(rollout_id, attempt))
return {REPLY.claimed, attempt, t[1], t[2], redis.call('GET', resources_latest) or '', used, tostring(now), generation}
