-- Lift the pause and tell the paused workers at once (they listen on the channel while paused), with the latest
-- resources id, which they stamp on every call they admit from then on. The message is
-- 'resume|<epoch lifted>|<latest>': a worker opens only for the pause it is closed for, never for a newer one.
-- Returns {epoch that was paused or '', latest resources id or '', now} as strings.
local pause_key, gate_key, latest_key = KEYS[1], KEYS[2], KEYS[3]
local channel = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local was = redis.call('GET', pause_key)
redis.call('DEL', pause_key)
redis.call('HSET', gate_key, 'resumed_at', tostring(now))
local latest = redis.call('GET', latest_key) or ''
redis.call('PUBLISH', channel, 'resume|' .. (was or '') .. '|' .. latest)
return {was or '', latest, tostring(now)}
