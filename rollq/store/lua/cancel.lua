-- Cancel a task that has not finished: a queued one never runs (its RQ job is refused at claim), a running
-- one loses its attempt (the worker's later finish is answered 'cancelled' and dropped). Either way the task ends
-- now with the given cancelled rollout on the results stream, so every task still has exactly one outcome.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- KEYS: task, inflight, results, resources_refs, stats, results_trim
-- ARGV: rollout_id, rollout_json (metadata.status = "cancelled"; attempt and worker are filled in here), maxlen, now,
--       max_bytes
-- Returns {'missing'} | {'finished', state} | {'cancelled', previous_state, attempt, results_stream_id}
local t = redis.call('HMGET', KEYS[1], F.state, F.attempt, F.resources_id, F.mode, F.worker, F.task)
if not t[6] then
  return {'missing'}
end
local state = t[1] or 'queued'
if state ~= 'queued' and state ~= 'running' then
  return {'finished', state}
end
local attempt = tonumber(t[2] or '0') or 0
local rollout = cjson.decode(ARGV[2])
rollout['metadata']['attempt'] = attempt
rollout['metadata']['worker'] = t[5] or ''
if state == 'running' then
  redis.call('ZREM', KEYS[2], member(ARGV[1], attempt))
  redis.call('HSET', KEYS[1], end_field(attempt), history('cancelled', ARGV[4]))
end
local rollout_json = cjson.encode(rollout)
local id = redis.call('XADD', KEYS[3], '*', S.rollout_id, ARGV[1], S.rollout, rollout_json)
trim_results(KEYS[3], KEYS[5], KEYS[6], tonumber(ARGV[3]), tonumber(ARGV[5]), id, #ARGV[1] + #rollout_json)
redis.call('HSET', KEYS[1], F.state, 'cancelled', F.result, id, F.ended, ARGV[4])
if t[3] and t[3] ~= '' then
  if count(KEYS[4], t[3], -1) <= 0 then
    redis.call('HDEL', KEYS[4], t[3])
  end
end
count(KEYS[5], outcome_stat('cancelled', t[4]), 1)
return {'cancelled', state, attempt, id}
