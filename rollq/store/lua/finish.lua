-- Publish the final rollouts of a batch of tasks, each only if the attempt that reports it is still the current one.
-- This is what keeps completions <= tasks: a late result from a superseded attempt is recorded, never delivered.
-- The results stream is kept within its bounds by trim_results (lua/trim_results.lua, put before this script), once
-- for the batch. Each task's reply, in order: {'published', entry_id}; {'superseded'} when the attempt is not current
-- (its rollout is kept on the superseded stream); {'missing'} when the task record is gone (Redis lost it: a restart
-- without persistence, a flush, an eviction; the rollout is kept on the superseded stream with reason task-missing,
-- counted as that and not as superseded); {'alive'} when stale_before is set and the attempt heartbeated after
-- it (a reaper lost the race to a live worker); {'cancelled'} when the task was cancelled (the result is dropped: the
-- cancelled rollout already stands for the task); an error reply when its part of the script failed (the other
-- tasks' parts stand). Records each attempt's end in its task's history (end_field(attempt) = status|now).
-- A published reply carries a third item: the damaged keys this call skipped (see below), '' when none.
-- The stats hash's counters are summed over the batch and added once per field (issue 24: one HINCRBY per field a
-- batch, not per rollout), with count() and add_float() (see the header), which leave a corrupt counter alone
-- instead of failing after the first write: Redis does not undo a script that fails part way.
local inflight = KEYS[1]
local results = KEYS[2]
local superseded = KEYS[3]
local dead_letter = KEYS[4]
local resources_refs = KEYS[5]
local stats = KEYS[6]
local results_trim = KEYS[7]
local summaries = KEYS[8]
local task_keys = list_from(KEYS, 9)  -- one per task
local maxlen = tonumber(ARGV[1])
local max_bytes = tonumber(ARGV[2])
local task_args = list_from(ARGV, 3)  -- per task, PER_TASK items: see finish_one
local PER_TASK = 16

-- Checked before the first write. The results stream must be one (require_results: the call is refused, nothing
-- written). Any other key written here that holds another type than rollq writes there (something else wrote it)
-- is skipped and named in each published reply, for the worker to log: failing at its write, after the XADD, left
-- a rollout published with its task still running (or not counted, or with no summary), for a reaper to end it a
-- second time. Skipping loses nothing the trainer reads: the rollout is published and its task ended once; what is
-- skipped is an index or counter (an in-flight member or dead-letter entry cannot be kept in a key that is no
-- sorted set), which is as wrong as the damaged key already made it. A trim hash of another type is skipped by the
-- trim (lua/trim_results.lua), which keeps the stream within its bounds all the same.
require_results(results)
local inflight_ok = intact(inflight, 'zset', 'in-flight set')
local superseded_ok = intact(superseded, 'stream', 'superseded stream')
local dead_letter_ok = intact(dead_letter, 'zset', 'dead-letter set')
local refs_ok = intact(resources_refs, 'hash', 'resources refs hash')
local stats_ok = intact(stats, 'hash', 'stats hash')
local summaries_ok = intact(summaries, 'stream', 'summaries stream')
local trim_ok = intact(results_trim, 'hash', 'results trim hash')

local counts, count_order, floats, float_order = {}, {}, {}, {}
local function tally(field, by)
  if counts[field] == nil then
    counts[field] = 0
    count_order[#count_order + 1] = field
  end
  counts[field] = counts[field] + by
end
local function tally_float(field, by)
  if floats[field] == nil then
    floats[field] = by  -- one rollout's value is added as it was sent (a sum of several as Lua's number)
    float_order[#float_order + 1] = field
  else
    floats[field] = (tonumber(floats[field]) or 0) + (tonumber(by) or 0)
  end
end

-- One task's part; returns its reply and, when it published, {id, size, summary, mode} for its summary entry.
local function finish_one(task_key, a)
  local rollout_id = a[1]
  local attempt = a[2]  -- a string, as the task record holds it
  local rollout_json = a[3]
  local status = a[4]  -- the task's final state: STATE.succeeded or STATE.failed
  local now = a[5]
  local to_dead_letter = a[6] == '1'
  local stale_before = a[7]  -- '' unless a reaper finishes the attempt
  local duration_bucket = a[8]  -- '' when the duration is not counted
  local keep_seconds = a[9]  -- '0' keeps the task record
  local duration = a[10]
  local reward_bucket = a[11]  -- '' when there is no reward
  local reward = a[12]
  local resources_id = a[13]  -- the resources version the rollout ran with, '' when none
  local reward_missing = a[14] == '1'  -- a succeeded rollout with no reward at all
  local summary = a[15]  -- the rollout's compact summary, JSON (rollq.store.summaries)
  -- A big rollout is not an argument (Lua would get a copy of it): the caller SET it at this key just before
  -- (rollq.store.payloads), rollout_json is then ''. Published, the entry names the key, which loses its expiry and
  -- goes with the entry (trim_results); refused, the key is deleted.
  local ref = a[16]
  local size = #rollout_id + #rollout_json
  if ref ~= '' then
    local length = redis.call('STRLEN', ref)
    if length == 0 then
      return redis.error_reply('ERR the payload ' .. ref .. ' of rollout ' .. rollout_id .. ' is missing')
    end
    size = #rollout_id + length
  end
  local function drop_payload()
    if ref ~= '' then
      redis.call('DEL', ref)
    end
  end

  local t = redis.call('HMGET', task_key, F.state, F.attempt, F.mode, F.resources_id, F.result)
  if t[1] == STATE.cancelled then
    drop_payload()
    tally(STATS_DROPPED_CANCELLED, 1)
    return {REPLY.cancelled}
  end
  if t[1] == false and redis.call('EXISTS', task_key) == 0 then
    -- No task record at all: no newer attempt took over, Redis lost the record (and with it the in-flight entry, the
    -- RQ job...). The rollout cannot be delivered as the task's outcome (nothing says this attempt is current; the
    -- producer may enqueue the task again), so it is kept where the operator finds it, marked with why; a reaper's
    -- finish writes nothing, as for a superseded attempt.
    if stale_before == '' and superseded_ok then
      redis.call('XADD', superseded, 'MAXLEN', '~', maxlen, '*', S.rollout_id, rollout_id, S.attempt, attempt,
        S.rollout, ref ~= '' and redis.call('GET', ref) or rollout_json, S.reason, REASON_TASK_MISSING)
      tally(STATS_TASK_MISSING, 1)
    end
    drop_payload()
    return {REPLY.missing}
  end
  if t[1] ~= STATE.running or t[2] ~= attempt then
    if stale_before == '' and t[2] == attempt and t[5] then
      -- This attempt already published: if it was this very rollout (sent again because a
      -- connection drop swallowed the reply), answer as the first time did.
      -- (A payload key is the publication's own: the same key is the same rollout, kept now as the first time.)
      local entry = redis.call('XRANGE', results, t[5], t[5])
      if entry[1] and entry[1][2][4] == (ref ~= '' and ref or rollout_json) then
        if ref ~= '' then
          redis.call('PERSIST', ref)
        end
        return {REPLY.published, t[5]}
      end
    end
    if stale_before == '' and superseded_ok then
      -- Rare: a big rollout is copied into Lua here, to keep the superseded stream's one format.
      redis.call('XADD', superseded, 'MAXLEN', '~', maxlen, '*', S.rollout_id, rollout_id, S.attempt, attempt,
        S.rollout, ref ~= '' and redis.call('GET', ref) or rollout_json)
      tally(STATS_SUPERSEDED, 1)
    end
    drop_payload()
    return {REPLY.superseded}
  end
  local running = member(rollout_id, attempt)
  if stale_before ~= '' and inflight_ok then
    local deadline = redis.call('ZSCORE', inflight, running)
    if deadline and tonumber(deadline) > tonumber(stale_before) then
      drop_payload()
      return {REPLY.alive}
    end
  end
  -- The rollout (or its payload key) is the second field of the entry: the idempotency check above reads it at
  -- index 4.
  local id
  if ref ~= '' then
    id = redis.call('XADD', results, '*', S.rollout_id, rollout_id, S.ref, ref)
    redis.call('PERSIST', ref)
  else
    id = redis.call('XADD', results, '*', S.rollout_id, rollout_id, S.rollout, rollout_json)
  end
  redis.call('HSET', task_key, F.state, status, F.result, id, F.ended, now, end_field(attempt), history(status, now))
  if inflight_ok then
    redis.call('ZREM', inflight, running)
  end
  if refs_ok and t[4] and t[4] ~= '' then
    if count(resources_refs, t[4], -1) <= 0 then
      redis.call('HDEL', resources_refs, t[4])
    end
  end
  if to_dead_letter and dead_letter_ok then
    redis.call('ZADD', dead_letter, now, rollout_id)
  end
  tally(outcome_stat(status, t[3]), 1)
  if duration_bucket ~= '' then
    tally(duration_stat(duration_bucket), 1)
    tally_float(STATS_DURATION_SUM, duration)
  end
  if reward_bucket ~= '' then
    -- The reward histogram, by mode and resources version.
    tally(reward_stat(t[3], resources_id, reward_bucket), 1)
    tally_float(reward_stat(t[3], resources_id, REWARD_SUM), reward)
  end
  if reward_missing then
    tally(STATS_REWARD_MISSING, 1)
  end
  if keep_seconds ~= '0' and status == STATE.succeeded then
    redis.call('EXPIRE', task_key, keep_seconds)
  end
  return {REPLY.published, id, damaged()}, {id, size, summary, t[3], ref}
end

local replies = {}
-- The summary of the newest published rollout is added after the trim (trim_results expects the newest entry of
-- the results stream to have no summary yet); every earlier one as soon as the next rollout is published.
local newest, added, added_bytes = nil, 0, 0
for i, task_key in ipairs(task_keys) do
  local reply, published = guarded(finish_one, task_key, list_from(task_args, 1 + PER_TASK * (i - 1), PER_TASK * i))
  if published then
    if newest and summaries_ok then
      add_summary(summaries, maxlen, newest[1], newest[2], newest[3], newest[4], newest[5], newest[6])
    end
    newest = {task_args[1 + PER_TASK * (i - 1)], published[3], published[4], published[1], published[2], published[5]}
    added, added_bytes = added + 1, added_bytes + published[2]
  end
  replies[i] = reply
end
if newest then
  trim_results(
    results, stats, trim_ok and results_trim or nil, maxlen, max_bytes, newest[4], added_bytes, summaries, added)
  if summaries_ok then
    add_summary(summaries, maxlen, newest[1], newest[2], newest[3], newest[4], newest[5], newest[6])
  end
end
if stats_ok then
  for _, field in ipairs(count_order) do
    count(stats, field, counts[field])
  end
  for _, field in ipairs(float_order) do
    add_float(stats, field, floats[field])
  end
end
return replies
