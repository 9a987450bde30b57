-- Drop from the queued-task index the given task record keys whose task is no longer queued (the lost-job sweep's
-- clean-up). Checked here, not by the caller: a task requeued between the caller's read and this call stays.
-- A key that holds no hash (overwritten by something else) is no task record: dropped too, not read (HGET on it
-- would raise WRONGTYPE and stop the sweep for every other task). Returns how many were dropped.
local queued_tasks = KEYS[1]
local task_keys = list_from(KEYS, 2)

local dropped = 0
for _, task_key in ipairs(task_keys) do
  if redis.call('TYPE', task_key).ok ~= 'hash' or redis.call('HGET', task_key, F.state) ~= STATE.queued then
    dropped = dropped + redis.call('SREM', queued_tasks, task_key)
  end
end
return dropped
