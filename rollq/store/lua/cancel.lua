-- Cancel a task that has not finished: a queued one never runs (its RQ job is refused at claim), a running
-- one loses its attempt (the worker's later finish is answered 'cancelled' and dropped). Either way the task ends
-- now with the given cancelled rollout on the results stream, so every task still has exactly one outcome.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- Returns {'missing'} | {'finished', state} |
--   {'cancelled', previous_state, attempt, results_stream_id, the damaged keys skipped ('' when none)}
local task_key = KEYS[1]
local inflight = KEYS[2]
local results = KEYS[3]
local resources_refs = KEYS[4]
local stats = KEYS[5]
local results_trim = KEYS[6]
local summaries = KEYS[7]
local queued_tasks = KEYS[8]  -- the index of queued tasks (see enqueue.lua)
local rollout_id = ARGV[1]
local rollout_json = ARGV[2]  -- metadata.status = "cancelled"; attempt and worker are filled in here
local maxlen = tonumber(ARGV[3])
local now = ARGV[4]
local max_bytes = tonumber(ARGV[5])

-- Checked before the first write, as in finish.lua (see there why a damaged key is skipped, not failed on): the results
-- stream must be one; an in-flight set, queued-task index, resources refs, stats hash, summaries stream or results trim
-- hash of another type is skipped and named in the reply. A failure after the XADD left a cancelled rollout published
-- with its task still running and out of the in-flight set: never reaped, never ended.
require_results(results)
local inflight_ok = intact(inflight, 'zset', 'in-flight set')
local queued_ok = intact(queued_tasks, 'set', 'queued-task index')
local refs_ok = intact(resources_refs, 'hash', 'resources refs hash')
local stats_ok = intact(stats, 'hash', 'stats hash')
local summaries_ok = intact(summaries, 'stream', 'summaries stream')
local trim_ok = intact(results_trim, 'hash', 'results trim hash')

local t = redis.call('HMGET', task_key, F.state, F.attempt, F.resources_id, F.mode, F.worker, F.task)
if not t[6] then
  return {REPLY.missing}
end
local state = t[1] or STATE.queued
if state ~= STATE.queued and state ~= STATE.running then
  return {REPLY.finished, state}
end
local attempt = tonumber(t[2] or '0') or 0
local rollout = cjson.decode(rollout_json)
rollout['metadata']['attempt'] = attempt
-- Only a running task has a worker: a queued one's record still names the worker of the attempt a retry, a reaper or
-- a hand-back took back (TaskRecord.current_worker reads it the same way), which never ran this task to its end.
local worker = state == STATE.running and t[5] or ''
rollout['metadata']['worker'] = worker
if state == STATE.running then
  if inflight_ok then
    redis.call('ZREM', inflight, member(rollout_id, attempt))
  end
  redis.call('HSET', task_key, end_field(attempt), history(STATE.cancelled, now))
end
local published = cjson.encode(rollout)
local id = redis.call('XADD', results, '*', S.rollout_id, rollout_id, S.rollout, published)
local size = #rollout_id + #published
trim_results(results, stats, trim_ok and results_trim or nil, maxlen, max_bytes, id, size, summaries)
local summary = {status = STATE.cancelled, attempt = attempt}
if t[3] and t[3] ~= '' then summary['version'] = t[3] end
if worker ~= '' then summary['worker'] = worker end
if summaries_ok then
  add_summary(summaries, maxlen, rollout_id, cjson.encode(summary), t[4], id, size)
end
redis.call('HSET', task_key, F.state, STATE.cancelled, F.result, id, F.ended, now)
if queued_ok then
  redis.call('SREM', queued_tasks, task_key)
end
if refs_ok and t[3] and t[3] ~= '' then
  if count(resources_refs, t[3], -1) <= 0 then
    redis.call('HDEL', resources_refs, t[3])
  end
end
if stats_ok then
  count(stats, outcome_stat(STATE.cancelled, t[4]), 1)
end
return {REPLY.cancelled, state, attempt, id, damaged()}
