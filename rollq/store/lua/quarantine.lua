-- Move a job id that is not a well-formed rollq job off one of RQ's lists of a rollq queue into the namespace's
-- quarantine list, where no worker or RQ clean-up reads it; its hash is left for inspection.
-- Returns 1 moved, 0 it was no longer on the source list.
local source = KEYS[1]  -- the RQ queue or its intermediate list
local quarantine = KEYS[2]
local job_id = ARGV[1]

-- A quarantine list of another type refuses the move naming it before the first write (Redis does not undo a script
-- that fails part way: the job was taken off the source and then failed on, left on no list at all).
require(quarantine, 'list', 'quarantine list')

if redis.call('LREM', source, 0, job_id) == 0 then
  return 0
end
redis.call('LREM', quarantine, 0, job_id)
redis.call('RPUSH', quarantine, job_id)
return 1
