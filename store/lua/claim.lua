-- Claim a queued task for one attempt: count the claim, stamp its time, start the heartbeat clock.
-- Only the RQ job that currently stands for the task may claim it, so a stray or duplicated job runs nothing.
-- KEYS: task, inflight, resources_latest
-- ARGV: rollout_id, job_id, worker_name, now
-- Returns {'missing'} | {'stale', state} | {'ok', attempt, task_json, policy_json, latest_resources_id|'', attempts_used}
local t = redis.call('HMGET', KEYS[1], 'task', 'policy', 'state', 'job', 'unresponsive', 'worker', 'attempt', 'attempts')
if not t[1] then
  return {'missing'}
end
if t[3] == 'running' and t[4] == ARGV[2] and t[6] == ARGV[3] then
  -- This worker's own claim, sent again because a connection drop swallowed the reply.
  return {'ok', tonumber(t[7]), t[1], t[2], redis.call('GET', KEYS[3]) or '', tonumber(t[8])}
end
if t[3] ~= 'queued' or t[4] ~= ARGV[2] then
  return {'stale', t[3] or ''}
end
local attempt = redis.call('HINCRBY', KEYS[1], 'claims', 1)
local used = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'attempt', attempt, 'last_claim', ARGV[4], 'worker', ARGV[3])
redis.call('ZADD', KEYS[2], tonumber(ARGV[4]) + tonumber(t[5]), ARGV[1] .. '|' .. attempt)
return {'ok', attempt, t[1], t[2], redis.call('GET', KEYS[3]) or '', used}
