-- Read-only: one page of the summaries stream, newest first, filtered inside Redis so that only matches travel.
-- Scans at most `scan_limit` entries older than `top` (an XREVRANGE bound: '+' or '(<id>'), in chunks of 500,
-- stopping once `limit` entries match. A filter value of '' matches anything; `mode` is compared with the entry's
-- mode field, the others with the summary's JSON keys (status, version, group).
-- Returns {matches (as XREVRANGE entries), last scanned id or '', scanned count, exhausted (1/0)}.
local summaries = KEYS[1]
local top = ARGV[1]
local limit = tonumber(ARGV[2])
local scan_limit = tonumber(ARGV[3])
local want_status, want_mode, want_version, want_group = ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local function field(entry, name)
  local f = entry[2]
  for i = 1, #f, 2 do
    if f[i] == name then return f[i + 1] end
  end
  return nil
end

local function keep(entry)
  if want_mode ~= '' and field(entry, S.mode) ~= want_mode then return false end
  if want_status == '' and want_version == '' and want_group == '' then return true end
  local ok, s = pcall(cjson.decode, field(entry, S.summary) or '')
  if not ok or type(s) ~= 'table' then return false end
  return (want_status == '' or s['status'] == want_status)
    and (want_version == '' or s['version'] == want_version)
    and (want_group == '' or s['group'] == want_group)
end

local out, scanned, last = {}, 0, ''
while scanned < scan_limit do
  local entries = redis.call('XREVRANGE', summaries, top, '-', 'COUNT', math.min(500, scan_limit - scanned))
  if #entries == 0 then
    return {out, last, scanned, 1}
  end
  for _, e in ipairs(entries) do
    scanned = scanned + 1
    last = e[1]
    if keep(e) then
      out[#out + 1] = e
      if #out >= limit then
        return {out, last, scanned, 0}
      end
    end
  end
  top = '(' .. last
end
return {out, last, scanned, 0}
