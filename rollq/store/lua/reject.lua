-- Fail a queued task that cannot be run because its record is invalid (a field that is not what rollq wrote):
-- its failed rollout, naming the problem, is published as the task's outcome and the task is dead-lettered.
-- Only the job that currently stands for the task may do this, as only it may claim the task.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- KEYS: task, results, dead_letter, stats, resources_refs, results_trim
-- ARGV: rollout_id, job_id, rollout_json, maxlen, now, max_bytes
-- Returns {'published', entry_id} | {'superseded'} when the task no longer waits for that job.
local t = redis.call('HMGET', KEYS[1], F.state, F.job, F.mode, F.resources_id)
if t[1] ~= 'queued' or t[2] ~= ARGV[2] then
  return {'superseded'}
end
local id = redis.call('XADD', KEYS[2], '*', S.rollout_id, ARGV[1], S.rollout, ARGV[3])
trim_results(KEYS[2], KEYS[4], KEYS[6], tonumber(ARGV[4]), tonumber(ARGV[6]), id, #ARGV[1] + #ARGV[3])
redis.call('HSET', KEYS[1], F.state, 'failed', F.result, id, F.ended, ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
count(KEYS[4], outcome_stat('failed', t[3] or ''), 1)
if t[4] and t[4] ~= '' and count(KEYS[5], t[4], -1) <= 0 then
  redis.call('HDEL', KEYS[5], t[4])
end
return {'published', id}
