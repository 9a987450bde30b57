-- Put back a job that a worker took off the queue but never started: its id is left in RQ's intermediate list
-- (the reply to the worker's BLMOVE was lost to a Redis restart, or the worker died right after it) while the task
-- still waits for that job. The first pass that sees it only marks it; a pass unresponsive_seconds (at most 30 s)
-- later pushes it back, well before RQ's own cleanup would fail the job. Pushing back is safe even if a slow worker
-- starts the job after all: only one claim of a job can win.
-- KEYS: task, rq_intermediate, rq_queue, marker, stats
-- ARGV: job_id, now
-- Returns 1 pushed back, 0 not (or not yet) stranded.
local t = redis.call('HMGET', KEYS[1], F.state, F.job, F.unresponsive)
if t[1] ~= 'queued' or t[2] ~= ARGV[1] then
  redis.call('DEL', KEYS[4])
  return 0
end
local seen = redis.call('GET', KEYS[4])
if not seen then
  redis.call('SET', KEYS[4], ARGV[2], 'EX', math.ceil(2 * tonumber(t[3])) + 60)
  return 0
end
if tonumber(ARGV[2]) - tonumber(seen) < math.min(tonumber(t[3]), 30) then
  return 0
end
redis.call('DEL', KEYS[4])
if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[5], requeue_stat('stranded'), 1)
return 1
