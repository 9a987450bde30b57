-- Queue a new task once: its record, its RQ job and the queue push happen together or not at all.
-- KEYS: task, rq_queue, rq_queues, rq_job, resources_refs, resources_version (task again when unpinned)
-- ARGV: task_json, policy_json, unresponsive_seconds, job_id, resources_id|'', mode|'', job hash field/value pairs...
-- Returns 1 queued, 0 already known (the id is queued once), -1 unknown resources id.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if ARGV[5] ~= '' then
  if redis.call('EXISTS', KEYS[6]) == 0 then
    return -1
  end
  redis.call('HINCRBY', KEYS[5], ARGV[5], 1)
end
redis.call('HSET', KEYS[1], 'task', ARGV[1], 'policy', ARGV[2], 'unresponsive', ARGV[3], 'job', ARGV[4],
  'resources_id', ARGV[5], 'mode', ARGV[6], 'state', 'queued', 'claims', 0, 'attempts', 0)
redis.call('HSET', KEYS[4], unpack(ARGV, 7))
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('SADD', KEYS[3], KEYS[2])
return 1
