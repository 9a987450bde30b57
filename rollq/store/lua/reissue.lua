-- Queue again a task whose RQ job vanished: deleted (rq-dashboard's Delete or Empty buttons, `rq empty`) or left
-- on none of RQ's lists (a flushed list). A vanished job hash is acted on at once: nothing in rollq deletes the hash
-- of a job its task still waits for. A job hash on none of the lists is only marked on the first sighting and acted
-- on when a later pass, unresponsive_seconds (at most 30 s) on, finds it still so: a worker between RQ's lists could otherwise be raced.
-- The list check (two LPOS, linear in the lists' length) runs only when `deep` is 1: the caller bounds how many
-- it asks for.
-- KEYS: task, rq_queue, rq_intermediate, rq_queues, old rq_job, new rq_job, marker, stats
-- ARGV: rollout_id, old_job_id, new_job_id, now, deep (0|1),
--       new job hash field/value pairs... (the first pair is 'data', payload)
-- Returns 1 queued again, 0 not (or not yet), -1 the new job id holds a job hash that stands for something else.
local t = redis.call('HMGET', KEYS[1], F.state, F.job, F.unresponsive)
if t[1] ~= 'queued' or t[2] ~= ARGV[2] then
  redis.call('DEL', KEYS[7])
  return 0
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  if ARGV[5] ~= '1' then
    return 0
  end
  if redis.call('LPOS', KEYS[2], ARGV[2]) or redis.call('LPOS', KEYS[3], ARGV[2]) then
    redis.call('DEL', KEYS[7])
    return 0
  end
  local seen = tonumber(redis.call('GET', KEYS[7]))
  if not seen then
    redis.call('SET', KEYS[7], ARGV[4], 'EX', 600)
    return 0
  end
  if tonumber(ARGV[4]) - seen < math.min(tonumber(t[3]) or 30, 30) then
    return 0
  end
end
local taken = redis.call('HGET', KEYS[6], 'data')
if taken and taken ~= ARGV[7] then
  return -1
end
redis.call('DEL', KEYS[7])
redis.call('HSET', KEYS[1], F.job, ARGV[3])
redis.call('HSET', KEYS[6], unpack(ARGV, 6))
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('SADD', KEYS[4], KEYS[2])
count(KEYS[8], requeue_stat('vanished'), 1)
return 1
