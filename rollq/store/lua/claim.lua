-- Claim a queued task for one attempt: count the claim, stamp its time, start the heartbeat clock.
-- Only the RQ job that currently stands for the task may claim it, so a stray or duplicated job runs nothing.
-- The heartbeat deadline is Redis's own time plus unresponsive_seconds, so clients' clocks do not matter.
-- Every number is checked before the first write: Redis does not undo a script that fails part way.
-- A cancelled task is not 'queued', so its claim is refused as stale.
-- Also records the attempt in the task's history (claim_field(attempt) = worker|claim time; only the newest
-- HISTORY_LIMIT attempts are kept).
-- KEYS: task, inflight, resources_latest
-- ARGV: rollout_id, job_id, worker_name
-- Returns {'missing'} | {'stale', state} | {'invalid', reason} (nothing written) |
--         {'claimed', attempt, task_json, policy_json, latest_resources_id|'', attempts_used, now, generation}
-- (F, S, member and the stats helpers come from the header rollq.store.keys.lua_header() puts before every script.)
local t = redis.call('HMGET', KEYS[1], F.task, F.policy, F.state, F.job, F.unresponsive, F.worker, F.attempt,
  F.attempts, F.claims, F.generation)
if not t[1] then
  return {'missing'}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local generation = tonumber(t[10]) or 1
if t[3] == 'running' and t[4] == ARGV[2] and t[6] == ARGV[3] then
  -- This worker's own claim, sent again because a connection drop swallowed the reply.
  return {'claimed', tonumber(t[7]), t[1], t[2], redis.call('GET', KEYS[3]) or '', tonumber(t[8]), tostring(now),
    generation}
end
if t[3] ~= 'queued' or t[4] ~= ARGV[2] then
  return {'stale', t[3] or ''}
end
local unresponsive = tonumber(t[5])
if not unresponsive or unresponsive <= 0 then
  return {'invalid', F.unresponsive .. ' is ' .. tostring(t[5]) .. ', not a positive number'}
end
for _, i in ipairs({8, 9}) do
  if t[i] and not string.match(t[i], '^%d+$') then
    return {'invalid', (i == 8 and F.attempts or F.claims) .. ' is ' .. t[i] .. ', not a whole number'}
  end
end
local attempt = redis.call('HINCRBY', KEYS[1], F.claims, 1)
local used = redis.call('HINCRBY', KEYS[1], F.attempts, 1)
redis.call('HSET', KEYS[1], F.state, 'running', F.attempt, attempt, F.last_claim, tostring(now), F.worker, ARGV[3],
  claim_field(attempt), history(ARGV[3], tostring(now)))
if attempt > HISTORY_LIMIT then
  redis.call('HDEL', KEYS[1], claim_field(attempt - HISTORY_LIMIT), end_field(attempt - HISTORY_LIMIT))
end
redis.call('ZADD', KEYS[2], now + unresponsive, member(ARGV[1], attempt))
return {'claimed', attempt, t[1], t[2], redis.call('GET', KEYS[3]) or '', used, tostring(now), generation}
