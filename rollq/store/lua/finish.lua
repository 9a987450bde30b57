-- Publish the final rollout of a task, if the attempt that reports it is still the current one.
-- This is what keeps completions <= tasks: a late result from a superseded attempt is recorded, never delivered.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script).
-- KEYS: task, inflight, results, superseded, dead_letter, resources_refs, stats, results_trim
-- ARGV: rollout_id, attempt, rollout_json, status, maxlen, now, dead_letter(0|1), stale_before|'',
--       duration_bucket|'', keep_seconds (0 = keep the record), duration_seconds, max_bytes,
--       reward_bucket|'' (no reward), reward, resources version used|'', reward_missing(0|1)
-- Returns {'published', entry_id}; {'superseded'} when the attempt is not current (its rollout is kept on the
-- superseded stream); {'alive'} when stale_before is set and the attempt heartbeated after it (a reaper lost the
-- race to a live worker); {'cancelled'} when the task was cancelled (the result is dropped: the cancelled rollout
-- already stands for the task). Records the attempt's end in the task's history (end_field(attempt) = status|now).
-- Counters are added to with count() (see the header), which leaves a corrupt counter alone instead of failing
-- after the first write: Redis does not undo a script that fails part way.
local t = redis.call('HMGET', KEYS[1], F.state, F.attempt, F.mode, F.resources_id, F.result)
if t[1] == 'cancelled' then
  count(KEYS[7], STATS_DROPPED_CANCELLED, 1)
  return {'cancelled'}
end
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  if ARGV[8] == '' and t[2] == ARGV[2] and t[5] then
    -- This attempt already published: if it was this very rollout (sent again because a
    -- connection drop swallowed the reply), answer as the first time did.
    local entry = redis.call('XRANGE', KEYS[3], t[5], t[5])
    if entry[1] and entry[1][2][4] == ARGV[3] then
      return {'published', t[5]}
    end
  end
  if ARGV[8] == '' then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', S.rollout_id, ARGV[1], S.attempt, ARGV[2], S.rollout, ARGV[3])
    count(KEYS[7], STATS_SUPERSEDED, 1)
  end
  return {'superseded'}
end
local running = member(ARGV[1], ARGV[2])
if ARGV[8] ~= '' then
  local deadline = redis.call('ZSCORE', KEYS[2], running)
  if deadline and tonumber(deadline) > tonumber(ARGV[8]) then
    return {'alive'}
  end
end
-- The rollout is the second field of the entry: the idempotency check above reads it at index 4.
local id = redis.call('XADD', KEYS[3], '*', S.rollout_id, ARGV[1], S.rollout, ARGV[3])
trim_results(KEYS[3], KEYS[7], KEYS[8], tonumber(ARGV[5]), tonumber(ARGV[12]), id, #ARGV[1] + #ARGV[3])
redis.call('HSET', KEYS[1], F.state, ARGV[4], F.result, id, F.ended, ARGV[6], end_field(ARGV[2]), history(ARGV[4], ARGV[6]))
redis.call('ZREM', KEYS[2], running)
if t[4] and t[4] ~= '' then
  if count(KEYS[6], t[4], -1) <= 0 then
    redis.call('HDEL', KEYS[6], t[4])
  end
end
if ARGV[7] == '1' then
  redis.call('ZADD', KEYS[5], ARGV[6], ARGV[1])
end
count(KEYS[7], outcome_stat(ARGV[4], t[3]), 1)
if ARGV[9] ~= '' then
  count(KEYS[7], duration_stat(ARGV[9]), 1)
  if tonumber(redis.call('HGET', KEYS[7], STATS_DURATION_SUM) or '0') then
    redis.call('HINCRBYFLOAT', KEYS[7], STATS_DURATION_SUM, ARGV[11])
  end
end
if ARGV[13] and ARGV[13] ~= '' then
  -- The reward histogram, by mode and resources version.
  count(KEYS[7], reward_stat(t[3], ARGV[15], ARGV[13]), 1)
  local reward_sum = reward_stat(t[3], ARGV[15], REWARD_SUM)
  if tonumber(redis.call('HGET', KEYS[7], reward_sum) or '0') then
    redis.call('HINCRBYFLOAT', KEYS[7], reward_sum, ARGV[14])
  end
end
if ARGV[16] == '1' then
  count(KEYS[7], STATS_REWARD_MISSING, 1)
end
if ARGV[10] ~= '0' and ARGV[4] == 'succeeded' then
  redis.call('EXPIRE', KEYS[1], ARGV[10])
end
return {'published', id}
