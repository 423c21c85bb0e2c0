-- Token bucket; twin of TokenBucket in rls/core/algorithms/buckets.py.
local function tb_tokens(key, now, a)
  local tokens, last = bk_read(key)
  if tokens == nil then return a.burst end
  if a.cap > 0 and now > last then
    tokens = tokens + (now - last) * a.cap / a.window
  end
  return math.min(a.burst, tokens)
end

return {
  evaluate = function(key, now, a)
    if a.cap <= 0 then
      a.st = 0
      return false, 0, 0, a.window, 0
    end
    local tokens = tb_tokens(key, now, a)
    local hits = a.hits
    local need = math.max(hits, 1)
    local ok = tokens >= need
    local reset
    if ok then reset = bk_time(a.burst - (tokens - hits), a)
    else reset = bk_time(need - tokens, a) end
    a.st = tokens
    return ok, math.max(0, math.floor(tokens - hits)), math.max(0, math.floor(tokens)), reset,
      math.max(0, a.burst - math.floor(tokens))
  end,
  charge = function(key, now, a)
    local tokens = a.st - a.hits
    bk_store(key, tokens, now, bk_time(a.burst - tokens, a))
  end,
  release = function(key, now, a)
    local tokens = math.min(a.burst, a.st + a.hits)
    bk_store(key, tokens, now, bk_time(a.burst - tokens, a))
    return math.max(0, math.floor(tokens))
  end,
}

