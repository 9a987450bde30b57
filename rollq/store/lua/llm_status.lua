-- Where a pause stands: the live workers (report not expired), how many closed their gate for the current epoch,
-- the LLM calls they still have running and waiting, and up to max_listed workers that are not yet drained.
-- Returns {epoch or '', live, acknowledged, in_flight, waiting, now, then worker, ack, in_flight triples}.
local pause_key, workers_key, calls_key = KEYS[1], KEYS[2], KEYS[3]
local max_listed = tonumber(ARGV[1]) or 20
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local epoch = redis.call('GET', pause_key)
local live = redis.call('ZRANGEBYSCORE', workers_key, '(' .. now, '+inf')
local acked, in_flight, waiting = 0, 0, 0
local busy = {}
for start = 1, #live, 500 do
  local chunk = {}
  for i = start, math.min(start + 499, #live) do chunk[#chunk + 1] = live[i] end
  local reports = redis.call('HMGET', calls_key, unpack(chunk))
  for i, report in ipairs(reports) do
    local ack, calls, queued = 0, 0, 0
    if report then
      local a, c, q = string.match(report, '^(%d+)|(%d+)|(%d+)$')
      ack, calls, queued = tonumber(a) or 0, tonumber(c) or 0, tonumber(q) or 0
    end
    local current = epoch ~= false and tostring(ack) == epoch
    if current then
      acked = acked + 1
      in_flight = in_flight + calls
    end
    waiting = waiting + queued
    if (not current or calls > 0) and #busy < 3 * max_listed then
      busy[#busy + 1] = chunk[i]
      busy[#busy + 1] = tostring(ack)
      busy[#busy + 1] = tostring(calls)
    end
  end
end
local reply = {epoch or '', #live, acked, in_flight, waiting, tostring(now)}
for _, v in ipairs(busy) do reply[#reply + 1] = v end
return reply
