-- GCRA with an exact theoretical arrival time; twin of Gcra in rls/core/algorithms/buckets.py.
-- Value: "<base ms>:<k hits>", TAT = base + k * window / cap. Every comparison is one division
-- of exact integers, so ties are decided exactly and the same way as in Python.
local function gcra_state(key, now, a)
  local f = read_fields(key)
  if not f or #f ~= 2 then return now, 0 end
  local base, k = f[1], f[2]
  local whole = math.min(math.floor(k / a.cap), math.floor((now - base) / a.window))
  if whole > 0 then
    base = base + whole * a.window
    k = k - whole * a.cap
  end
  if (k * a.window) / a.cap < now - base then return now, 0 end
  return base, k
end

local function gcra_store(key, base, k, now, a)
  local span = math.ceil((k * a.window) / math.max(a.cap, 1))
  -- A TAT already in the past reads as an idle bucket either way; PX must stay positive.
  redis.call('SET', key, string.format('%d:%d', base, k), 'PX',
    math.max(1, base + span + GRACE_MS - now))
end

return {
  evaluate = function(key, now, a)
    if a.cap <= 0 or a.burst <= 0 then
      a.st = {now, 0}
      return false, 0, 0, a.window, 0
    end
    local base, k = gcra_state(key, now, a)
    local elapsed = now - base
    local hits = a.hits
    local need = math.max(hits, 1)
    local over_by = k + need - a.burst
    local ok = over_by <= 0 or (over_by * a.window) / a.cap <= elapsed
    local reset
    if ok then reset = math.ceil(((k + hits) * a.window) / a.cap - elapsed)
    else reset = math.ceil((over_by * a.window) / a.cap - elapsed) end
    local room = a.burst - k + math.floor((elapsed * a.cap) / a.window)
    local uncharged = math.min(a.burst, math.max(0, room))
    a.st = {base, k}
    return ok, math.max(0, uncharged - hits), uncharged, math.max(0, reset), a.burst - uncharged
  end,
  charge = function(key, now, a)
    gcra_store(key, a.st[1], a.st[2] + a.hits, now, a)
  end,
  release = function(key, now, a)
    if a.cap <= 0 then return 0 end
    local base, k = a.st[1], math.max(0, a.st[2] - a.hits)
    gcra_store(key, base, k, now, a)
    local room = a.burst - k + math.floor(((now - base) * a.cap) / a.window)
    return math.min(a.burst, math.max(0, room))
  end,
}
