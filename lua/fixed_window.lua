-- Fixed window with overdraft, calendar bounds and rolling windows; twin of
-- rls/core/algorithms/fixed_window.py. Two value layouts, by a.layout (rls/stores/windows.py):
-- FW_COUNTER, a plain epoch window (no overdraft, not rolling, no calendar): the key is the
--   window's own (`<counter key>@<window index>`, chosen by the client, which also passes the
--   window's bounds) and its value the usage as an integer, as in lua/decide_fixed_window.lua.
-- Otherwise the value is "<window start ms>:<usage incl. debt>:<debt at window start>" in a key
-- that outlives windows. Rolling (FW_ROLLING): the start is the key's first charge; a key
-- without a live window is not written by a 0-hit charge or a release (no window starts
-- without a hit).
local function fw_bounds(now, a)
  if a.stop > 0 then return a.start, a.stop, a.prev end
  local start = now - now % a.window
  return start, start + a.window, start - a.window
end

local function fw_read(key, now, a)
  local f = read_fields(key)
  if a.layout == FW_ROLLING then
    if f and #f == 3 and now < f[1] + a.window then
      return f[1], f[1] + a.window, f[2], 0, true
    end
    return now, now + a.window, 0, 0, false
  end
  local start, stop, prev = fw_bounds(now, a)
  local usage, debt = 0, 0
  if f and #f == 3 then
    if f[1] == start then
      usage, debt = f[2], f[3]
    elseif f[1] == prev and a.overdraft > 0 then
      debt = math.max(0, f[2] - a.cap)
      usage = debt
    end
  end
  return start, stop, usage, debt, true
end

local function fw_store(key, start, stop, usage, debt, now, a)
  local keep = 0
  if a.overdraft > 0 then keep = 2 * (stop - start) end  -- the next window may be longer
  redis.call('SET', key, string.format('%d:%d:%d', start, usage, debt),
    'PX', stop + keep + GRACE_MS - now)
end

-- FW_COUNTER: the usage alone; a.st = {usage, whether the key exists}.
local counter = {
  evaluate = function(key, now, a)
    local v = redis.call('GET', key)
    local usage = tonumber(v) or 0
    local ok
    if a.hits == 0 then ok = usage < a.cap else ok = usage + a.hits <= a.cap end
    a.st = {usage, v}
    return ok, math.max(0, a.cap - usage - a.hits), math.max(0, a.cap - usage), a.stop - now, usage
  end,
  charge = function(key, now, a)
    if a.st[2] then
      redis.call('INCRBY', key, a.hits)
    else
      redis.call('SET', key, a.hits, 'PX', math.max(1, a.stop - now) + GRACE_MS)
    end
  end,
  release = function(key, now, a)
    local usage = math.max(0, a.st[1] - a.hits)
    if a.st[2] then redis.call('SET', key, usage, 'KEEPTTL') end
    return math.max(0, a.cap - usage)
  end,
}

return {
  evaluate = function(key, now, a)
    if a.layout == FW_COUNTER then
      a.impl = counter
      return counter.evaluate(key, now, a)
    end
    local start, stop, usage, debt, live = fw_read(key, now, a)
    local top = a.cap
    if debt == 0 then top = top + a.overdraft end
    local ok
    if a.hits == 0 then ok = usage < top else ok = usage + a.hits <= top end
    a.st = {start, stop, usage, debt, live}
    return ok, math.max(0, top - usage - a.hits), math.max(0, top - usage), stop - now, usage
  end,
  charge = function(key, now, a)
    if a.impl then return a.impl.charge(key, now, a) end
    local s = a.st
    if not s[5] and a.hits <= 0 then return end  -- rolling: a window starts with a hit
    -- With overdraft a 0-hit charge writes nothing (rls/stores/memory.py likewise): written,
    -- the debt carried from the previous window would move into this one, owed again next.
    if a.overdraft > 0 and a.hits <= 0 then return end
    fw_store(key, s[1], s[2], s[3] + a.hits, s[4], now, a)
  end,
  release = function(key, now, a)
    if a.impl then return a.impl.release(key, now, a) end
    local s = a.st
    local usage = math.max(0, s[3] - a.hits)
    local moves_debt = a.overdraft > 0 and a.hits <= 0  -- as in charge: a 0-hit write would
    if s[5] and not moves_debt then fw_store(key, s[1], s[2], usage, s[4], now, a) end
    local top = a.cap
    if s[4] == 0 then top = top + a.overdraft end
    return math.max(0, top - usage)
  end,
}
