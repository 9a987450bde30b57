-- Publish the final rollout of a task, if the attempt that reports it is still the current one.
-- This is what keeps completions <= tasks: a late result from a superseded attempt is recorded, never delivered.
-- KEYS: task, inflight, results, superseded, dead_letter, resources_refs, stats
-- ARGV: rollout_id, attempt, rollout_json, status, maxlen, now, dead_letter(0|1), stale_before|'',
--       duration_bucket|'', keep_seconds (0 = keep the record), duration_seconds
-- Returns the results stream id, 0 when the attempt is not current, -1 when stale_before is set
-- and the attempt heartbeated after it (the reaper lost the race to a live worker).
local member = ARGV[1] .. '|' .. ARGV[2]
local t = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'mode', 'resources_id', 'result')
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  if ARGV[8] == '' and t[2] == ARGV[2] and t[5] then
    -- This attempt already published: if it was this very rollout (sent again because a
    -- connection drop swallowed the reply), answer as the first time did.
    local entry = redis.call('XRANGE', KEYS[3], t[5], t[5])
    if entry[1] and entry[1][2][4] == ARGV[3] then
      return t[5]
    end
  end
  if ARGV[8] == '' then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'rollout_id', ARGV[1], 'attempt', ARGV[2], 'rollout', ARGV[3])
    redis.call('HINCRBY', KEYS[7], 'superseded', 1)
  end
  return 0
end
if ARGV[8] ~= '' then
  local deadline = redis.call('ZSCORE', KEYS[2], member)
  if deadline and tonumber(deadline) > tonumber(ARGV[8]) then
    return -1
  end
end
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'rollout_id', ARGV[1], 'rollout', ARGV[3])
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'result', id, 'ended', ARGV[6])
redis.call('ZREM', KEYS[2], member)
if t[4] and t[4] ~= '' then
  if redis.call('HINCRBY', KEYS[6], t[4], -1) <= 0 then
    redis.call('HDEL', KEYS[6], t[4])
  end
end
if ARGV[7] == '1' then
  redis.call('ZADD', KEYS[5], ARGV[6], ARGV[1])
end
redis.call('HINCRBY', KEYS[7], ARGV[4] .. ':' .. (t[3] or ''), 1)
if ARGV[9] ~= '' then
  redis.call('HINCRBY', KEYS[7], 'duration:' .. ARGV[9], 1)
  redis.call('HINCRBYFLOAT', KEYS[7], 'duration:sum', ARGV[11])
end
if ARGV[10] ~= '0' and ARGV[4] == 'succeeded' then
  redis.call('EXPIRE', KEYS[1], ARGV[10])
end
return id
