-- Reservations of `reserve:` limits (docs/token-budgets.md; rls/stores/redis/reservations.py).
-- One atomic step per call, so two settles of one reservation (two replicas, a retried call)
-- can never both apply: the first turns it settled, the second finds it settled.
--
-- KEYS[1]: hash  member -> state ("o,<estimate>,<window end ms>" open, "s" settled)
-- KEYS[2]: zset  member -> expiry ms (every record, open or settled)
-- KEYS[3]: hash  "bytes", "open": the records' estimated bytes, the open ones' number
-- ARGV[1]: mode: 'o' open, 's' settle, 'w' sweep only
-- ARGV[2]: now in ms, or '' for Redis TIME
-- ARGV[3]: the byte bound; ARGV[4]: estimated bytes per record besides its member
-- ARGV[5]: the most expired records one call drops
-- 'o': ARGV[6..] quads (member, estimate, window end ms, expire ms).
-- 's': ARGV[6..] pairs (member, expire ms of a tombstone when none is found).
-- Reply: {expired (open ones dropped by the sweep), dropped (records the sweep removed), then
--   'o': 1 per recorded reservation, 0 when it was not (at the bound, or already there);
--   's': per member the state found: the open state, "s" settled, "" none;
--   then the open records' number and the records' bytes}.
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local cap = tonumber(ARGV[3])
local overhead = tonumber(ARGV[4])
local batch = tonumber(ARGV[5])

local expired, dropped, freed, closed = 0, 0, 0, 0
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
for _, member in ipairs(old) do
  local state = redis.call('HGET', KEYS[1], member)
  if state and string.sub(state, 1, 1) == 'o' then
    expired = expired + 1
    closed = closed + 1
  end
  redis.call('HDEL', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
  freed = freed + overhead + string.len(member)
  dropped = dropped + 1
end
-- (never a -0: HINCRBY refuses "-0")
if freed > 0 then redis.call('HINCRBY', KEYS[3], 'bytes', -freed) end
if closed > 0 then redis.call('HINCRBY', KEYS[3], 'open', -closed) end
local bytes = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')

local res = {expired, dropped}
local mode = ARGV[1]
if mode == 'o' then
  local added, opened = 0, 0
  for i = 6, #ARGV, 4 do
    local member = ARGV[i]
    local size = overhead + string.len(member)
    if bytes + added + size > cap or redis.call('HEXISTS', KEYS[1], member) == 1 then
      res[#res + 1] = 0
    else
      redis.call('HSET', KEYS[1], member, 'o,' .. ARGV[i + 1] .. ',' .. ARGV[i + 2])
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[i + 3]), member)
      added = added + size
      opened = opened + 1
      res[#res + 1] = 1
    end
  end
  if opened > 0 then
    redis.call('HINCRBY', KEYS[3], 'bytes', added)
    redis.call('HINCRBY', KEYS[3], 'open', opened)
  end
  bytes = bytes + added
elseif mode == 's' then
  local added, settled = 0, 0
  for i = 6, #ARGV, 2 do
    local member = ARGV[i]
    local state = redis.call('HGET', KEYS[1], member)
    if state then
      if string.sub(state, 1, 1) == 'o' then
        redis.call('HSET', KEYS[1], member, 's')  -- its expiry stays: the tombstone's
        settled = settled + 1
      end
      res[#res + 1] = state
    else
      -- None: a settle without a reservation. A tombstone makes a repeat of it a no-op too
      -- (when the bound has room for it).
      local size = overhead + string.len(member)
      if bytes + added + size <= cap then
        redis.call('HSET', KEYS[1], member, 's')
        redis.call('ZADD', KEYS[2], now + tonumber(ARGV[i + 1]), member)
        added = added + size
      end
      res[#res + 1] = ''
    end
  end
  if added > 0 then redis.call('HINCRBY', KEYS[3], 'bytes', added) end
  if settled > 0 then redis.call('HINCRBY', KEYS[3], 'open', -settled) end
  bytes = bytes + added
end
res[#res + 1] = tonumber(redis.call('HGET', KEYS[3], 'open') or '0')
res[#res + 1] = bytes
return res
