-- GCRA (theoretical arrival time, "%.17g"); twin of Gcra in rls/engine/algorithms/buckets.py.
ALGOS[6] = {
  evaluate = function(key, now, a)
    if a.cap <= 0 or a.burst <= 0 then
      a.st = now
      return false, 0, 0, a.window, 0
    end
    local interval = a.window / a.cap
    local v = redis.call('GET', key)
    local tat = now
    if v then tat = math.max(tonumber(v), now) end
    local hits = a.hits
    local need = math.max(hits, 1)
    local horizon = a.burst * interval
    local ok = tat + need * interval - now <= horizon
    local new_tat = tat + hits * interval
    local reset
    if ok then reset = math.ceil(new_tat - now)
    else reset = math.ceil(tat + need * interval - horizon - now) end
    local uncharged = math.max(0, math.floor((horizon - (tat - now)) / interval))
    local charged = math.max(0, math.floor((horizon - (new_tat - now)) / interval))
    a.st = tat
    return ok, charged, uncharged, reset, math.max(0, a.burst - uncharged)
  end,
  charge = function(key, now, a)
    local tat = a.st + a.hits * (a.window / a.cap)
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil(tat) + GRACE_MS - now)
  end,
  release = function(key, now, a)
    local interval = a.window / math.max(a.cap, 1)
    local tat = math.max(now, a.st - a.hits * interval)
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil(tat) + GRACE_MS - now)
    if a.cap <= 0 or a.burst <= 0 then return 0 end
    return math.max(0, math.floor((a.burst * interval - (tat - now)) / interval))
  end,
}
