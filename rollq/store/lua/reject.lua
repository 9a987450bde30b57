-- Fail a queued task that cannot be run because its record is invalid (a field that is not what rollq wrote, a
-- state it never writes among them): its failed rollout, naming the problem, is published as the task's outcome
-- and the task is dead-lettered.
-- Only the job that currently stands for the task may do this, as only it may claim the task. A task key that
-- holds no hash (something other than rollq wrote it) has no job to check: it is failed once, by the first job
-- of its rollout id, its key left alone.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- Returns {'published', entry_id, the damaged keys skipped ('' when none)} | {'superseded'} when the task no
-- longer waits for that job.
local task_key = KEYS[1]
local results = KEYS[2]
local dead_letter = KEYS[3]
local stats = KEYS[4]
local resources_refs = KEYS[5]
local results_trim = KEYS[6]
local summaries = KEYS[7]
local queued_tasks = KEYS[8]  -- the index of queued tasks (see enqueue.lua)
local rollout_id = ARGV[1]
local job_id = ARGV[2]
local rollout_json = ARGV[3]
local maxlen = tonumber(ARGV[4])
local now = ARGV[5]
local max_bytes = tonumber(ARGV[6])
local summary = ARGV[7]  -- the rollout's compact summary, JSON (rollq.store.summaries)

-- Checked before the first write, as in finish.lua (see there why a damaged key is skipped, not failed on): the results
-- stream must be one; a dead-letter set, queued-task index, resources refs, stats hash, summaries stream or results
-- trim hash of another type is skipped and named in the reply. A failure after the XADD left the failed rollout
-- published with the task still waiting for its job, to be failed (and published) again.
require_results(results)
local dead_letter_ok = intact(dead_letter, 'zset', 'dead-letter set')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')
local refs_ok = intact(resources_refs, 'hash', 'resources refs hash')
local stats_ok = intact(stats, 'hash', 'stats hash')
local summaries_ok = intact(summaries, 'stream', 'summaries stream')
local trim_ok = intact(results_trim, 'hash', 'results trim hash')

local t = redis.pcall('HMGET', task_key, F.state, F.job, F.mode, F.resources_id)
local foreign = is_wrong_type(t)
if foreign then
  -- The task key holds no hash (claim.lua answered 'invalid' naming it): there is no record to check the job
  -- against or to end, and the key is not rollq's to change. The dead-letter set says whether the task was
  -- already failed, so a second job of the same rollout id publishes nothing: one failed rollout, counted once.
  -- (A damaged dead-letter set cannot say: then it is published, readers dropping a second copy; see Delivered.)
  if dead_letter_ok and redis.call('ZSCORE', dead_letter, rollout_id) then
    return {REPLY.superseded}
  end
  t = {}
elseif t.err then
  return t
else
  local waiting = t[1] == STATE.queued or (t[1] and not is_state(t[1]))  -- queued, or a state rollq never writes
  if not waiting or t[2] ~= job_id then
    return {REPLY.superseded}
  end
end
local id = redis.call('XADD', results, '*', S.rollout_id, rollout_id, S.rollout, rollout_json)
local size = #rollout_id + #rollout_json
trim_results(results, stats, trim_ok and results_trim or nil, maxlen, max_bytes, id, size, summaries)
if summaries_ok then
  add_summary(summaries, maxlen, rollout_id, summary, t[3], id, size)
end
if not foreign then
  redis.call('HSET', task_key, F.state, STATE.failed, F.result, id, F.ended, now)
end
if queued_ok then
  redis.call('SREM', queued_tasks, task_key)
end
if dead_letter_ok then
  redis.call('ZADD', dead_letter, now, rollout_id)
end
if stats_ok then
  count(stats, outcome_stat(STATE.failed, t[3] or ''), 1)
end
if refs_ok and t[4] and t[4] ~= '' and count(resources_refs, t[4], -1) <= 0 then
  redis.call('HDEL', resources_refs, t[4])
end
return {REPLY.published, id, damaged()}
