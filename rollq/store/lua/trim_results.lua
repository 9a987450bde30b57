-- Library, not a script: put before finish.lua, reject.lua and cancel.lua by rollq.store.scripts. Keeps the results
-- stream within its bounds without ever dropping an entry a consumer group still needs, until the hard byte limit
-- forces it.
--
-- The bounds: at most `maxlen` entries and half of `max_bytes` payload bytes (rollout JSON + rollout id); trimming
-- down to them stops at the oldest entry some group has not been delivered or has not acknowledged. Past `max_bytes`
-- the stream is trimmed anyway, and each group that loses entries gets them counted in the trim hash
-- (`count:<group>`, `from:<group>`), which its readers raise as RolloutsTrimmedError and `rollq status` shows.
-- Trimming goes 1% below a bound so that a full stream is not trimmed on every publish.
-- An idle group (no consumer of it has talked to Redis for GROUP_IDLE_MS, or the trim hash's IDLE_MS_FIELD when
-- set; a group with no consumer at all for that long, timed from when a trim first saw it so, in the trim hash's
-- 'seen:<group>': a reader that just created its group has not read yet) holds nothing back: a reader that went away (a Ctrl-C'd
-- `rollq rollouts tail --group`) must not pin the stream past its bounds. What it loses is counted for it, as for
-- the hard limit, so a reader that comes back is told (RolloutsTrimmedError).
-- The payload byte count is kept in the stats hash (STATS_RESULTS_BYTES); the trim hash's TRIMMED_TO holds the id
-- of the first entry kept by the last trim, so a reader can tell whether entries it had not read yet were removed.
-- A trim learns the ids and sizes of the entries it may remove from their summaries (entry_reader below), so it
-- never reads a rollout back.

local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local function id_lt(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  return am < bm or (am == bm and as < bs)
end

-- Whether every consumer of `group` has been idle longer than `idle_ms`; a group without consumers counts from
-- when a trim first saw it without any.
local function group_idle(stream, trim, group, idle_ms)
  local consumers = redis.call('XINFO', 'CONSUMERS', stream, group)
  local seen_field = 'seen:' .. group
  if #consumers == 0 then
    if not trim then
      return false  -- no trim hash to time it in (one of another type, skipped): it holds back as a new group does
    end
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local seen = tonumber(redis.call('HGET', trim, seen_field) or '')
    if not seen then
      redis.call('HSET', trim, seen_field, now_ms)
      return false
    end
    return now_ms - seen > idle_ms
  end
  if trim and redis.call('HEXISTS', trim, seen_field) == 1 then
    redis.call('HDEL', trim, seen_field)
  end
  for _, c in ipairs(consumers) do
    for i = 1, #c, 2 do
      if c[i] == 'idle' and tonumber(c[i + 1]) <= idle_ms then
        return false
      end
    end
  end
  return true
end

-- Each group's need: the entries after its last-delivered id, and its pending ones (from the first pending id).
local function group_needs(stream, trim, idle_ms)
  local needs = {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #g, 2 do
      info[g[i]] = g[i + 1]
    end
    local need = {name = info['name'], delivered = info['last-delivered-id']}
    need.idle = group_idle(stream, trim, need.name, idle_ms)
    if tonumber(info['pending']) > 0 then
      need.first_pending = redis.call('XPENDING', stream, need.name)[2]
    end
    needs[#needs + 1] = need
  end
  return needs
end

local function needed_by(need, id)
  if need.idle then
    return false
  end
  return id_lt(need.delivered, id) or (need.first_pending ~= nil and not id_lt(id, need.first_pending))
end

-- The name every payload key of `stream`'s namespace starts with (rollq.store.keys: RESULTS_KEY, PAYLOAD_KEY).
local function payload_prefix(stream)
  return string.sub(stream, 1, #stream - #RESULTS_KEY) .. PAYLOAD_KEY .. ':'
end

-- A results entry's payload bytes (rollout id + rollout JSON, in the entry or at the payload key it names instead:
-- rollq.store.payloads), what STATS_RESULTS_BYTES counts; and that payload key, or nil. An entry rollq did not
-- write (other fields, a ref that is not a payload key of this namespace, or names no string) counts 0 bytes, as
-- none were counted when it was added, and names no key: it is trimmed like any other, and the key it names is not
-- the trim's to delete. (An outside audit found one such entry failing every later publication half way.)
local function entry_size(e, payloads)
  local f = e[2]
  if f[1] ~= S.rollout_id or type(f[2]) ~= 'string' or type(f[4]) ~= 'string' then
    return 0, nil
  end
  if f[3] == S.rollout then
    return #f[2] + #f[4], nil
  end
  if f[3] == S.ref and string.sub(f[4], 1, #payloads) == payloads then
    local length = redis.pcall('STRLEN', f[4])
    if type(length) == 'number' and length > 0 then
      return #f[2] + length, f[4]
    end
  end
  return 0, nil
end

-- Delete the payload keys of removed entries, a few hundred a call (unpack has a limit).
local function delete_payloads(refs)
  for i = 1, #refs, 500 do
    redis.call('DEL', unpack(refs, i, math.min(#refs, i + 499)))
  end
end

-- A summary's fields by name.
local function summary_fields(flat)
  local f = {}
  for i = 1, #flat, 2 do
    f[flat[i]] = flat[i + 1]
  end
  return f
end

-- The results stream's entries, oldest first, n at a time as {id, size, summary_id, payload key or nil} lists. The ids and sizes come
-- from the summaries stream (one small entry per result, XADDed by the same script, its SIZE field the result's
-- payload bytes), not from the results themselves: reading a big rollout back into Lua only to measure it cost Redis
-- as much CPU as publishing it. The walk starts where the last trim stopped (SUMMARIES_FROM in the trim hash), and
-- only if the summary there describes the stream's first entry (TRIMMED_TO, which only a trim moves): then every
-- entry from there on has its summary, in order. Otherwise (the first trim of a stream, summaries trimmed shorter
-- than the results by a smaller maxlen, a summary without a size from an older rollq, the summaries run out) it
-- reads the results stream itself, from where the summaries left off.
local function entry_reader(stream, summaries, trim, payloads)
  local reader = {from_results = true, last = nil}
  local scursor = trim and redis.call('HGET', trim, SUMMARIES_FROM)
  local first = trim and redis.call('HGET', trim, TRIMMED_TO)
  local pending = {}  -- summaries read ahead by the check below
  if scursor and first then
    local head = redis.call('XRANGE', summaries, scursor, '+', 'COUNT', 1)[1]
    if head and summary_fields(head[2])[S.result] == first then
      reader.from_results, pending = false, {head}
    end
  end
  function reader.next(n)
    local out = {}
    while not reader.from_results and #out < n do
      local entries = pending
      if #entries == 0 then
        entries = redis.call('XRANGE', summaries, scursor, '+', 'COUNT', n)
      end
      pending = {}
      if #entries == 0 then
        reader.from_results = true
        break
      end
      for _, e in ipairs(entries) do
        local f = summary_fields(e[2])
        local id, size = f[S.result], tonumber(f[S.size] or '')
        if not (id and size) then
          reader.from_results = true
          break
        end
        out[#out + 1] = {id, size, e[1], f[S.ref]}
        reader.last, scursor = id, '(' .. e[1]
      end
    end
    if reader.from_results and #out < n then
      local from = reader.last and ('(' .. reader.last) or '-'
      for _, e in ipairs(redis.call('XRANGE', stream, from, '+', 'COUNT', n - #out)) do
        local size, ref = entry_size(e, payloads)
        out[#out + 1] = {e[1], size, nil, ref}
        reader.last = e[1]
      end
    end
    return out
  end
  return reader
end

-- The summary of entry `id`, the stream's first after a trim, found from the newest summaries back (`kept` entries
-- are left, the newest of them not summarised yet), so that the next trim can walk the summaries; nil when it is not
-- where it should be (summaries missing), or too far back to look for in one trim.
local function find_summary(summaries, id, kept)
  if kept > 10000 then
    return nil
  end
  local back = redis.call('XREVRANGE', summaries, '+', '-', 'COUNT', math.max(1, kept - 1))
  local e = back[#back]
  if e and summary_fields(e[2])[S.result] == id then
    return e[1]
  end
  return nil
end

-- The payload bytes of the whole stream, counted entry by entry: after a trim removed entries the summaries did
-- not describe (the stream was trimmed or emptied by something else), the counter starts over from this.
local function stream_bytes(stream)
  local total, cursor, payloads = 0, '-', payload_prefix(stream)
  while true do
    local entries = redis.call('XRANGE', stream, cursor, '+', 'COUNT', 100)
    if #entries == 0 then
      return total
    end
    for _, e in ipairs(entries) do
      total = total + entry_size(e, payloads)
    end
    cursor = '(' .. entries[#entries][1]
  end
end

-- Add `by` to the payload byte counter; a counter that is not a whole number (corrupt, or written by something
-- else) is counted again from the stream. Returns the count.
local function add_bytes(stream, stats, by)
  local bytes = redis.pcall('HINCRBY', stats, STATS_RESULTS_BYTES, by)
  if type(bytes) ~= 'number' then
    bytes = stream_bytes(stream)
    redis.pcall('HSET', stats, STATS_RESULTS_BYTES, bytes)
  end
  return bytes
end

local function trim_within_bounds(stream, stats, trim, maxlen, max_bytes, newest, added_bytes, summaries, added)
  local len = redis.call('XLEN', stream)
  local bytes
  if len <= (added or 1) then
    bytes = added_bytes  -- a new (or emptied) stream: the counter starts over, whatever drifted before
    redis.pcall('HSET', stats, STATS_RESULTS_BYTES, bytes)
  else
    bytes = add_bytes(stream, stats, added_bytes)
  end
  local soft_bytes = math.floor(max_bytes / 2)
  if len <= maxlen and bytes <= soft_bytes then
    return
  end
  local target_len, target_bytes = maxlen - math.floor(maxlen / 100), soft_bytes - math.floor(soft_bytes / 100)
  local forced = bytes > max_bytes
  local hard_target = max_bytes - math.floor(max_bytes / 100)
  local idle_ms = tonumber(trim and redis.call('HGET', trim, IDLE_MS_FIELD) or '') or GROUP_IDLE_MS
  local needs = group_needs(stream, trim, idle_ms)
  local removed, removed_bytes, cut, first_removed = 0, 0, nil, nil
  local cut_summary, last_summary = nil, nil  -- where the next trim's walk of the summaries starts
  local lost_now = {}  -- group -> {count, from}: entries it was never delivered
  local refs = {}  -- the payload keys of removed entries
  local payloads = payload_prefix(stream)
  local reader = entry_reader(stream, summaries, trim, payloads)
  while true do
    -- Read about as many entries as the bounds need gone (ids and sizes), at most 100 at a time.
    local want = len - target_len
    if bytes > target_bytes then
      want = math.max(want, math.ceil((bytes - target_bytes) / math.max(1, bytes / len)))
    end
    local entries = reader.next(math.max(1, math.min(100, want)))
    if #entries == 0 then
      break
    end
    for _, e in ipairs(entries) do
      local id = e[1]
      if id == newest or (len <= target_len and bytes <= target_bytes) then
        cut, cut_summary = id, e[3]
        break
      end
      local needed = false
      for _, need in ipairs(needs) do
        needed = needed or needed_by(need, id)
      end
      if needed and (not forced or bytes <= hard_target) then
        cut, cut_summary = id, e[3]
        break
      end
      for _, need in ipairs(needs) do
        if id_lt(need.delivered, id) then  -- never delivered to this group; pending ones are counted below
          local l = lost_now[need.name] or {count = 0, from = id}
          l.count = l.count + 1
          lost_now[need.name] = l
        end
      end
      first_removed = first_removed or id
      local size = e[2]
      removed, removed_bytes = removed + 1, removed_bytes + size
      if e[4] and string.sub(e[4], 1, #payloads) == payloads then  -- a summary names only its result's payload
        refs[#refs + 1] = e[4]
      end
      len, bytes = len - 1, bytes - size
      last_summary = e[3] or last_summary
    end
    if cut then
      break
    end
  end
  if removed == 0 then
    return
  end
  cut = cut or newest
  delete_payloads(refs)
  if redis.call('XTRIM', stream, 'MINID', cut) == removed then
    add_bytes(stream, stats, -removed_bytes)
  else
    redis.pcall('HSET', stats, STATS_RESULTS_BYTES, stream_bytes(stream))
  end
  if not trim then
    return  -- the trim hash holds another type (skipped, named by the caller): no bookkeeping, the stream trimmed
  end
  redis.call('HSET', trim, TRIMMED_TO, cut)
  if cut == newest then
    cut_summary = last_summary and ('(' .. last_summary)  -- the newest's summary comes next
  elseif not cut_summary then
    cut_summary = find_summary(summaries, cut, len)
  end
  if cut_summary then
    redis.call('HSET', trim, SUMMARIES_FROM, cut_summary)
  else
    redis.call('HDEL', trim, SUMMARIES_FROM)
  end
  for _, need in ipairs(needs) do
    if forced or need.idle then
      local l = lost_now[need.name] or {count = 0}
      if need.first_pending ~= nil and id_lt(need.first_pending, cut) then
        -- Delivered but not acknowledged: a reader that dies now would leave them to a reader that finds nothing.
        local pending = redis.call('XPENDING', stream, need.name, first_removed, '(' .. cut, removed)
        if #pending > 0 then
          l.count, l.from = l.count + #pending, pending[1][1]
        end
      end
      if l.count > 0 then
        redis.call('HINCRBY', trim, 'count:' .. need.name, l.count)
        redis.call('HSETNX', trim, 'from:' .. need.name, l.from)
      end
    end
  end
end

-- KEYS-free: the caller passes the key names; `trim_key` nil when the trim hash holds another type than a hash (the
-- caller checked it with intact() before its first write, and names it in its reply): the stream is trimmed all
-- the same, without the hash's bookkeeping (each trim then reads the sizes from the results, a group without
-- consumers holds back as a new one, no loss is counted: a reader is not told of entries the hard limit took).
-- NEWEST is the newest entry the caller added, ADDED (1 if nil) how many entries it added in this call, ADDED_BYTES
-- their payload bytes. Returns nothing.
-- Its callers run it after their first write (the XADD it trims for), and Redis does not undo a script that fails
-- part way: nothing in it may fail theirs. A trim that fails all the same (a key of the wrong type its caller did
-- not check) is logged in Redis's log and leaves the stream as it is, for the next publication's trim.
local function trim_results(stream, stats, trim_key, maxlen, max_bytes, newest, added_bytes, summaries, added)
  local ok, err = pcall(
    trim_within_bounds, stream, stats, trim_key, maxlen, max_bytes, newest, added_bytes, summaries, added)
  if not ok then
    local message = type(err) == 'table' and (err.err or tostring(err)) or tostring(err)
    redis.log(redis.LOG_WARNING, 'rollq: trimming ' .. stream .. ' failed, left for the next trim: ' .. message)
  end
end
