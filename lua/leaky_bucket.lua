-- Leaky bucket as a meter; twin of LeakyBucket in rls/core/algorithms/buckets.py.
local function lb_level(key, now, a)
  local level, last = bk_read(key)
  if level == nil then return 0 end
  if a.cap > 0 and now > last then
    level = level - (now - last) * a.cap / a.window
  end
  return math.max(0, level)
end

return {
  evaluate = function(key, now, a)
    if a.cap <= 0 then
      a.st = 0
      return false, 0, 0, a.window, 0
    end
    local level = lb_level(key, now, a)
    local hits = a.hits
    local need = math.max(hits, 1)
    local ok = level + need <= a.burst
    local reset
    if ok then reset = bk_time(level + hits, a)
    else reset = bk_time(level + need - a.burst, a) end
    a.st = level
    return ok, math.max(0, math.floor(a.burst - level - hits)),
      math.max(0, math.floor(a.burst - level)), reset, math.floor(level)
  end,
  charge = function(key, now, a)
    local level = a.st + a.hits
    bk_store(key, level, now, bk_time(level, a))
  end,
  release = function(key, now, a)
    local level = math.max(0, a.st - a.hits)
    bk_store(key, level, now, bk_time(level, a))
    return math.max(0, math.floor(a.burst - level))
  end,
}

