-- Sliding window (two-window weighted counter); twin of rls/core/algorithms/sliding_window.py.
-- Value: "<window start ms>:<current count>:<previous count>".
local function sw_read(key, now, window)
  local start = now - now % window
  local cur, prev = 0, 0
  local f = read_fields(key)
  if f and #f == 3 then
    if f[1] == start then
      cur, prev = f[2], f[3]
    elseif f[1] == start - window then
      prev = f[2]
    end
  end
  return start, cur, prev
end

local function sw_store(key, start, cur, prev, now, window)
  redis.call('SET', key, string.format('%d:%d:%d', start, cur, prev),
    'PX', start + 2 * window + GRACE_MS - now)
end

return {
  evaluate = function(key, now, a)
    local window = a.window
    local start, cur, prev = sw_read(key, now, window)
    local elapsed = now - start
    local used = math.floor(prev * (window - elapsed) / window) + cur
    local cap, hits = a.cap, a.hits
    local ok
    if hits == 0 then ok = used < cap else ok = used + hits <= cap end
    local reset
    if ok then
      reset = window - elapsed
    else
      local avail = cap - cur - math.max(hits, 1)
      if avail >= 0 and prev > 0 then
        local wait = math.ceil(window - (avail + 1) * window / prev)
        reset = math.max(1, wait - elapsed)
      else
        reset = window - elapsed
      end
    end
    a.st = {start, cur, prev}
    return ok, math.max(0, cap - used - hits), math.max(0, cap - used), reset, used
  end,
  charge = function(key, now, a)
    local s = a.st
    sw_store(key, s[1], s[2] + a.hits, s[3], now, a.window)
  end,
  release = function(key, now, a)
    local s = a.st
    local cur = math.max(0, s[2] - a.hits)
    sw_store(key, s[1], cur, s[3], now, a.window)
    local used = math.floor(s[3] * (a.window - (now - s[1])) / a.window) + cur
    return math.max(0, a.cap - used)
  end,
}
