-- Shared helpers of the bucket algorithms (token bucket, leaky bucket).
-- Bucket value: "<tokens or level %.17g>:<last ms>". Float arithmetic in the same order as
-- rls/core/algorithms/buckets.py so both give bit-identical answers.
local function bk_read(key)
  local f = read_fields(key)
  if not f or #f ~= 2 then return nil, nil end
  return f[1], f[2]
end

local function bk_time(amount, a)
  if a.cap <= 0 then return a.window end
  return math.ceil(amount * a.window / a.cap)
end

local function bk_store(key, value, now, ttl)
  redis.call('SET', key, string.format('%.17g:%d', value, now), 'PX', ttl + GRACE_MS)
end

