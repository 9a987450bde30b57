-- Move a job id that is not a well-formed rollq job off one of RQ's lists of a rollq queue into the namespace's
-- quarantine list, where no worker or RQ clean-up reads it; its hash is left for inspection.
-- KEYS: source list (RQ queue or intermediate list), quarantine
-- ARGV: job_id
-- Returns 1 moved, 0 it was no longer on the source list.
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then
  return 0
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
