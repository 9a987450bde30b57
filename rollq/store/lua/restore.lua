-- Put back a job that a worker took off the queue but never started: its id is left in RQ's intermediate list
-- (the reply to the worker's BLMOVE was lost to a Redis restart, or the worker died right after it) while the task
-- still waits for that job. The first pass that sees it only marks it; a pass unresponsive_seconds (at most 30 s)
-- later pushes it back, well before RQ's own cleanup would fail the job. Pushing back is safe even if a slow worker
-- starts the job after all: only one claim of a job can win.
-- A job whose task no longer waits for it (its worker claimed it and died before RQ's start bookkeeping; the
-- reaper requeued the attempt) is a leftover: it is dropped from the list after 30 s, so that leftovers never
-- pile up in front of the entries a reaper reads.
-- KEYS: task, rq_intermediate, rq_queue, marker, stats
-- ARGV: job_id, now
-- Returns 1 pushed back, 0 not (or not yet) stranded, -1 a leftover dropped.
local t = redis.call('HMGET', KEYS[1], F.state, F.job, F.unresponsive)
local waiting = t[1] == 'queued' and t[2] == ARGV[1]
local grace = 30
if waiting then
  grace = math.min(tonumber(t[3]) or 30, 30)
end
local seen = redis.call('GET', KEYS[4])
if not seen or not tonumber(seen) then
  redis.call('SET', KEYS[4], ARGV[2], 'EX', 2 * grace + 60)
  return 0
end
if tonumber(ARGV[2]) - tonumber(seen) < grace then
  return 0
end
redis.call('DEL', KEYS[4])
if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then
  return 0
end
if not waiting then
  return -1
end
redis.call('LPUSH', KEYS[3], ARGV[1])
count(KEYS[5], requeue_stat('stranded'), 1)
return 1
