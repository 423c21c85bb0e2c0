-- Fixed window counter (epoch aligned), mirror of rls/engine/algorithms/fixed_window.py.
-- Value: "<window index>:<count>"; a value from another window reads as 0.
-- TTL is garbage collection only: end of window + 1 s.
local function fw_read(key, now, window)
  local v = redis.call('GET', key)
  if not v then return 0 end
  local sep = string.find(v, ':', 1, true)
  if not sep or tonumber(string.sub(v, 1, sep - 1)) ~= math.floor(now / window) then
    return 0
  end
  return tonumber(string.sub(v, sep + 1))
end

local function fw_store(key, count, now, window)
  redis.call('SET', key, string.format('%d:%d', math.floor(now / window), count),
    'PX', window - now % window + 1000)
end

ALGOS[1] = {
  -- returns ok(0/1), remaining if charged, remaining if not, reset ms, used, state
  evaluate = function(key, now, cap, window, hits)
    local count = fw_read(key, now, window)
    local ok
    if hits == 0 then ok = count < cap else ok = count + hits <= cap end
    return ok, math.max(0, cap - count - hits), math.max(0, cap - count), window - now % window,
      count
  end,
  charge = function(key, now, cap, window, hits, used)
    fw_store(key, used + hits, now, window)
  end,
  release = function(key, now, cap, window, hits, used)
    local count = math.max(0, used - hits)
    fw_store(key, count, now, window)
    return math.max(0, cap - count)
  end,
}
