-- Shared by sliding_log.lua and concurrency.lua; twin of rls/engine/algorithms/log.py.
-- A sorted set: score = time ms, member = "<seq>:<hits>". Entries at or before now - window
-- are pruned; sliding_log releases give back the newest hits, concurrency the oldest leases.
local function log_read(key, now, window)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window))
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local entries, used, maxseq = {}, 0, 0
  for i = 1, #raw, 2 do
    local m = raw[i]
    local sep = string.find(m, ':', 1, true)
    local seq = tonumber(string.sub(m, 1, sep - 1))
    local h = tonumber(string.sub(m, sep + 1))
    entries[#entries + 1] = {tonumber(raw[i + 1]), seq, h, m}
    used = used + h
    if seq > maxseq then maxseq = seq end
  end
  table.sort(entries, function(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    return x[2] < y[2]
  end)
  return entries, used, maxseq
end

local function log_expire(key, entries, now, window)
  local newest = nil
  for i = 1, #entries do
    if newest == nil or entries[i][1] > newest then newest = entries[i][1] end
  end
  if newest ~= nil then
    redis.call('PEXPIRE', key, string.format('%d', newest + window + GRACE_MS - now))
  end
end

local function log_algo(release_oldest)
  return {
    evaluate = function(key, now, a)
      local window = a.window
      local entries, used, maxseq = log_read(key, now, window)
      local cap, hits = a.cap, a.hits
      local ok
      if hits == 0 then ok = used < cap else ok = used + hits <= cap end
      local reset = window
      if ok then
        if #entries > 0 then reset = entries[1][1] + window - now end
      else
        local freed, need = 0, math.max(hits, 1)
        for i = 1, #entries do
          freed = freed + entries[i][3]
          if used - freed + need <= cap then
            reset = entries[i][1] + window - now
            break
          end
        end
      end
      a.st = {entries, used, maxseq}
      return ok, math.max(0, cap - used - hits), math.max(0, cap - used), reset, used
    end,
    charge = function(key, now, a)
      local entries, maxseq = a.st[1], a.st[3]
      if a.hits > 0 then
        redis.call('ZADD', key, string.format('%d', now),
          string.format('%d:%d', maxseq + 1, a.hits))
        entries[#entries + 1] = {now, maxseq + 1, a.hits}
      end
      log_expire(key, entries, now, a.window)
    end,
    release = function(key, now, a)
      local entries, used = a.st[1], a.st[2]
      local left = a.hits
      local released = 0
      local first, last, step = #entries, 1, -1
      if release_oldest then first, last, step = 1, #entries, 1 end
      local kept = {}
      for i = first, last, step do
        local e = entries[i]
        local take = math.min(left, e[3])
        if take > 0 then
          left = left - take
          released = released + take
          redis.call('ZREM', key, e[4])
          if e[3] - take > 0 then
            redis.call('ZADD', key, string.format('%d', e[1]),
              string.format('%d:%d', e[2], e[3] - take))
            kept[#kept + 1] = e
          end
        else
          kept[#kept + 1] = e
        end
      end
      log_expire(key, kept, now, a.window)
      return math.max(0, a.cap - (used - released))
    end,
  }
end

