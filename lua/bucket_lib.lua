-- Shared helpers of the bucket algorithms (token bucket, leaky bucket).
-- Bucket value: "<tokens or level %.17g>:<last ms>". Float arithmetic in the same order as
-- rls/engine/algorithms/buckets.py so both give bit-identical answers.
local function bk_read(key)
  local v = redis.call('GET', key)
  if not v then return nil, nil end
  local s1 = string.find(v, ':', 1, true)
  return tonumber(string.sub(v, 1, s1 - 1)), tonumber(string.sub(v, s1 + 1))
end

local function bk_time(amount, a)
  if a.cap <= 0 then return a.window end
  return math.ceil(amount * a.window / a.cap)
end

local function bk_store(key, value, now, ttl)
  redis.call('SET', key, string.format('%.17g:%d', value, now), 'PX', ttl + GRACE_MS)
end

