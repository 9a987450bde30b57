-- Claim a queued task for one attempt: count the claim, stamp its time, start the heartbeat clock.
-- Only the RQ job that currently stands for the task may claim it, so a stray or duplicated job runs nothing.
-- KEYS: task, inflight, resources_latest
-- ARGV: rollout_id, job_id, worker_name, now
-- Returns {'missing'} | {'stale', state} |
--   {'claimed', attempt, task_json, policy_json, latest_resources_id|'', attempts_used, generation}
-- (F, S, member and the stats helpers come from the header rollq.store.keys.lua_header() puts before every script.)
local t = redis.call('HMGET', KEYS[1], F.task, F.policy, F.state, F.job, F.unresponsive, F.worker, F.attempt, F.attempts,
  F.generation)
if not t[1] then
  return {'missing'}
end
if t[3] == 'running' and t[4] == ARGV[2] and t[6] == ARGV[3] then
  -- This worker's own claim, sent again because a connection drop swallowed the reply.
  return {'claimed', tonumber(t[7]), t[1], t[2], redis.call('GET', KEYS[3]) or '', tonumber(t[8]), tonumber(t[9]) or 1}
end
if t[3] ~= 'queued' or t[4] ~= ARGV[2] then
  return {'stale', t[3] or ''}
end
local attempt = redis.call('HINCRBY', KEYS[1], F.claims, 1)
local used = redis.call('HINCRBY', KEYS[1], F.attempts, 1)
redis.call('HSET', KEYS[1], F.state, 'running', F.attempt, attempt, F.last_claim, ARGV[4], F.worker, ARGV[3])
redis.call('ZADD', KEYS[2], tonumber(ARGV[4]) + tonumber(t[5]), member(ARGV[1], attempt))
return {'claimed', attempt, t[1], t[2], redis.call('GET', KEYS[3]) or '', used, tonumber(t[9]) or 1}
