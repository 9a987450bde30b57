-- Publish the final rollout of a task, if the attempt that reports it is still the current one.
-- This is what keeps completions <= tasks: a late result from a superseded attempt is recorded, never delivered.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- Returns {'published', entry_id}; {'superseded'} when the attempt is not current (its rollout is kept on the
-- superseded stream); {'alive'} when stale_before is set and the attempt heartbeated after it (a reaper lost the
-- race to a live worker); {'cancelled'} when the task was cancelled (the result is dropped: the cancelled rollout
-- already stands for the task). Records the attempt's end in the task's history (end_field(attempt) = status|now).
-- Counters are added to with count() (see the header), which leaves a corrupt counter alone instead of failing
-- after the first write: Redis does not undo a script that fails part way.
local task_key = KEYS[1]
local inflight = KEYS[2]
local results = KEYS[3]
local superseded = KEYS[4]
local dead_letter = KEYS[5]
local resources_refs = KEYS[6]
local stats = KEYS[7]
local results_trim = KEYS[8]
local summaries = KEYS[9]
local rollout_id = ARGV[1]
local attempt = ARGV[2]  -- a string, as the task record holds it
local rollout_json = ARGV[3]
local status = ARGV[4]  -- the task's final state: STATE.succeeded or STATE.failed
local maxlen = ARGV[5]
local now = ARGV[6]
local to_dead_letter = ARGV[7] == '1'
local stale_before = ARGV[8]  -- '' unless a reaper finishes the attempt
local duration_bucket = ARGV[9]  -- '' when the duration is not counted
local keep_seconds = ARGV[10]  -- '0' keeps the task record
local duration = ARGV[11]
local max_bytes = tonumber(ARGV[12])
local reward_bucket = ARGV[13]  -- '' when there is no reward
local reward = ARGV[14]
local resources_id = ARGV[15]  -- the resources version the rollout ran with, '' when none
local reward_missing = ARGV[16] == '1'  -- a succeeded rollout with no reward at all
local summary = ARGV[17]  -- the rollout's compact summary, JSON (rollq.store.summaries)

local t = redis.call('HMGET', task_key, F.state, F.attempt, F.mode, F.resources_id, F.result)
if t[1] == STATE.cancelled then
  count(stats, STATS_DROPPED_CANCELLED, 1)
  return {REPLY.cancelled}
end
if t[1] ~= STATE.running or t[2] ~= attempt then
  if stale_before == '' and t[2] == attempt and t[5] then
    -- This attempt already published: if it was this very rollout (sent again because a
    -- connection drop swallowed the reply), answer as the first time did.
    local entry = redis.call('XRANGE', results, t[5], t[5])
    if entry[1] and entry[1][2][4] == rollout_json then
      return {REPLY.published, t[5]}
    end
  end
  if stale_before == '' then
    redis.call('XADD', superseded, 'MAXLEN', '~', maxlen, '*', S.rollout_id, rollout_id, S.attempt, attempt,
      S.rollout, rollout_json)
    count(stats, STATS_SUPERSEDED, 1)
  end
  return {REPLY.superseded}
end
local running = member(rollout_id, attempt)
if stale_before ~= '' then
  local deadline = redis.call('ZSCORE', inflight, running)
  if deadline and tonumber(deadline) > tonumber(stale_before) then
    return {REPLY.alive}
  end
end
-- The rollout is the second field of the entry: the idempotency check above reads it at index 4.
local id = redis.call('XADD', results, '*', S.rollout_id, rollout_id, S.rollout, rollout_json)
local size = #rollout_id + #rollout_json
trim_results(results, stats, results_trim, tonumber(maxlen), max_bytes, id, size, summaries)
add_summary(summaries, tonumber(maxlen), rollout_id, summary, t[3], id, size)
redis.call('HSET', task_key, F.state, status, F.result, id, F.ended, now, end_field(attempt), history(status, now))
redis.call('ZREM', inflight, running)
if t[4] and t[4] ~= '' then
  if count(resources_refs, t[4], -1) <= 0 then
    redis.call('HDEL', resources_refs, t[4])
  end
end
if to_dead_letter then
  redis.call('ZADD', dead_letter, now, rollout_id)
end
count(stats, outcome_stat(status, t[3]), 1)
if duration_bucket ~= '' then
  count(stats, duration_stat(duration_bucket), 1)
  if tonumber(redis.call('HGET', stats, STATS_DURATION_SUM) or '0') then
    redis.call('HINCRBYFLOAT', stats, STATS_DURATION_SUM, duration)
  end
end
if reward_bucket and reward_bucket ~= '' then
  -- The reward histogram, by mode and resources version.
  count(stats, reward_stat(t[3], resources_id, reward_bucket), 1)
  local reward_sum = reward_stat(t[3], resources_id, REWARD_SUM)
  if tonumber(redis.call('HGET', stats, reward_sum) or '0') then
    redis.call('HINCRBYFLOAT', stats, reward_sum, reward)
  end
end
if reward_missing then
  count(stats, STATS_REWARD_MISSING, 1)
end
if keep_seconds ~= '0' and status == STATE.succeeded then
  redis.call('EXPIRE', task_key, keep_seconds)
end
return {REPLY.published, id}
