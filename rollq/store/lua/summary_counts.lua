-- Read-only: how many summaries fall in each time bucket, over the newest `count` entries, counted inside Redis
-- (only the counts travel). Buckets are `bucket_ms` wide, keyed by their start (ms since the epoch).
-- Returns a flat list {bucket_start, count, ...}.
local summaries = KEYS[1]
local count = tonumber(ARGV[1])
local bucket_ms = tonumber(ARGV[2])
local counts, order = {}, {}
local top = '+'
local seen = 0
while seen < count do
  local entries = redis.call('XREVRANGE', summaries, top, '-', 'COUNT', math.min(1000, count - seen))
  if #entries == 0 then break end
  for _, e in ipairs(entries) do
    local ms = tonumber(string.match(e[1], '^(%d+)'))
    local b = ms - (ms % bucket_ms)
    if not counts[b] then
      counts[b] = 0
      order[#order + 1] = b
    end
    counts[b] = counts[b] + 1
  end
  seen = seen + #entries
  top = '(' .. entries[#entries][1]
end
local out = {}
for _, b in ipairs(order) do
  out[#out + 1] = b
  out[#out + 1] = counts[b]
end
return out
