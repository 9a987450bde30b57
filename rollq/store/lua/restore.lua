-- Put back a job that a worker took off the queue but never started: its id is left in RQ's intermediate list
-- (the reply to the worker's BLMOVE was lost to a Redis restart, or the worker died right after it) while the task
-- still waits for that job. The first pass that sees it only marks it; a pass unresponsive_seconds (at most 30 s)
-- later pushes it back, well before RQ's own cleanup would fail the job. Pushing back is safe even if a slow worker
-- starts the job after all: only one claim of a job can win.
-- A job whose task no longer waits for it (its worker claimed it and died before RQ's start bookkeeping; the
-- reaper requeued the attempt) is a leftover: it is dropped from the list after 30 s, so that leftovers never
-- pile up in front of the entries a reaper reads.
-- Returns 1 pushed back ({1, the damaged keys skipped} when it skipped any), 0 not (or not yet) stranded, -1 a
-- leftover dropped.
local task_key = KEYS[1]
local rq_intermediate = KEYS[2]
local rq_queue = KEYS[3]
local marker = KEYS[4]  -- when a pass first saw the job stranded
local stats = KEYS[5]
local pack_keys = list_from(KEYS, 6)  -- a pack's other tasks (tasks_per_job > 1): the job waits if any waits
local job_id = ARGV[1]
local now = ARGV[2]

-- Checked before the first write (Redis does not undo a script that fails part way; see require and intact in the
-- header): an RQ queue or intermediate list of another type refuses the call naming it, nothing written (an LPUSH
-- that failed after the LREM left the job on none of RQ's lists); the job stays stranded for a later pass once the
-- key is repaired. A damaged stats hash is skipped and named in the reply.
require(rq_queue, 'list', 'RQ queue')
require(rq_intermediate, 'list', 'RQ intermediate list')
local stats_ok = intact(stats, 'hash', 'stats hash')

local waiting, grace = false, 30
local function look(key)
  local t = redis.call('HMGET', key, F.state, F.job, F.unresponsive)
  if t[1] == STATE.queued and t[2] == job_id then
    waiting = true
    grace = math.min(grace, tonumber(t[3]) or 30)
  end
end
look(task_key)
for _, key in ipairs(pack_keys) do
  look(key)
end
local seen = redis.call('GET', marker)
if not seen or not tonumber(seen) then
  redis.call('SET', marker, now, 'EX', 2 * grace + 60)
  return 0
end
if tonumber(now) - tonumber(seen) < grace then
  return 0
end
redis.call('DEL', marker)
if redis.call('LREM', rq_intermediate, 1, job_id) == 0 then
  return 0
end
if not waiting then
  return -1
end
redis.call('LPUSH', rq_queue, job_id)
if stats_ok then
  count(stats, requeue_stat('stranded'), 1)
end
return with_damaged(1)
