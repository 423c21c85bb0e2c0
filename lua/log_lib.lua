-- Shared by sliding_log.lua and concurrency.lua; twin of rls/core/algorithms/log.py.
-- A sorted set of entries: score = time ms, member = "<cum>:<hits>", where cum is the running
-- total of hits in the log up to and including this entry, written as 16 zero-padded digits so
-- that entries of one millisecond sort by it. Hits in the window are then
-- cum(newest) - cum(oldest) + hits(oldest): two O(log n) reads, never a scan. A new entry is
-- logged no earlier than the newest one (a clock that stepped back, or Cluster nodes' skew:
-- it then expires a little later, never sooner), so cum grows along the set's order.
-- Numbers go to redis.call as they are: Redis writes a Lua number with %.17g (exact for the
-- integers below 2^53 used here), so no string.format is spent on them.
-- Entries at or before now - window are pruned; sliding_log releases give back the newest hits,
-- concurrency the oldest leases. Logs written by earlier rls versions ("<seq>:<hits>") are
-- rewritten in this form the first time they are read.
local LOG_MEMBER = '%016d:%d'

-- cum, hits of a member; nil for a member in the earlier form.
local function log_parse(m)
  if string.byte(m, 17) ~= 58 then return nil end
  return tonumber(string.sub(m, 1, 16)), tonumber(string.sub(m, 18))
end

local function log_migrate(key, now, window)
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local entries = {}
  for i = 1, #raw, 2 do
    local m = raw[i]
    local sep = string.find(m, ':', 1, true)
    entries[#entries + 1] = {tonumber(raw[i + 1]), tonumber(string.sub(m, 1, sep - 1)),
      tonumber(string.sub(m, sep + 1))}
  end
  table.sort(entries, function(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    return x[2] < y[2]
  end)
  redis.call('DEL', key)
  local cum = 0
  for i = 1, #entries do
    local e = entries[i]
    cum = cum + e[3]
    redis.call('ZADD', key, string.format('%d', e[1]), string.format(LOG_MEMBER, cum, e[3]))
  end
  if #entries > 0 then  -- the expiry rule of log charges (see charge below)
    local k = math.floor(entries[#entries][1] / window)
    redis.call('PEXPIRE', key, string.format('%d', (k + 2) * window + GRACE_MS - now))
  end
end

-- The live log's ends: {oldest time, oldest cum, oldest hits, newest time, newest cum}, or nil. Releases only remove or shrink entries, so the
-- expiry set when the newest entry was logged still covers whatever is left.
local function log_ends(key, now, window)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  for _ = 1, 2 do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #first == 0 then return nil end
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local c1, h1 = log_parse(first[1])
    local c2 = log_parse(last[1])
    if c1 and c2 then
      return {tonumber(first[2]), c1, h1, tonumber(last[2]), c2}
    end
    log_migrate(key, now, window)
  end
  error('rls: unreadable log at ' .. key)
end

-- Time and cum of the entry at `rank` (0 = oldest), or nil past the newest.
local function log_at(key, rank)
  local raw = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  if #raw == 0 then return nil, nil end
  return tonumber(raw[2]), log_parse(raw[1])
end

-- Time of the oldest entry whose removal (with all older ones) frees `excess` hits: the lowest
-- rank whose cum reaches oldest cum - oldest hits + excess. Every entry holds at least one hit,
-- so that rank is below `excess`; with one hit per entry it is exactly excess - 1 (one read),
-- otherwise a binary search on rank finds it in O(log n) reads of O(log n) each.
local function log_freeing(key, e, excess)
  if excess <= 1 then return e[1] end
  local target = e[2] - e[3] + excess
  local raw = redis.call('ZRANGE', key, excess - 2, excess - 1, 'WITHSCORES')
  if #raw == 4 and log_parse(raw[1]) < target then return tonumber(raw[4]) end
  local lo, hi = 0, excess - 2  -- the answer's rank is in [lo, hi]
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local _, c = log_at(key, mid)
    if c == nil or c >= target then hi = mid else lo = mid + 1 end
  end
  if lo == 0 then return e[1] end
  return (log_at(key, lo))
end

local function log_algo(release_oldest)
  return {
    evaluate = function(key, now, a)
      local window = a.window
      local e = log_ends(key, now, window)
      local used = 0
      if e then used = e[5] - e[2] + e[3] end
      local cap, hits = a.cap, a.hits
      local ok
      if hits == 0 then ok = used < cap else ok = used + hits <= cap end
      local reset = window
      if e then
        local need = math.max(hits, 1)
        if ok then
          reset = e[1] + window - now
        elseif need <= cap then
          reset = log_freeing(key, e, used + need - cap) + window - now
        end
      end
      a.st = e
      return ok, math.max(0, cap - used - hits), math.max(0, cap - used), reset, used
    end,
    charge = function(key, now, a)
      if a.hits <= 0 then return end
      local e = a.st
      local t, c = now, 0
      if e then
        if e[4] > t then t = e[4] end
        c = e[5]
      end
      redis.call('ZADD', key, t, string.format(LOG_MEMBER, c + a.hits, a.hits))
      -- The key must outlive its newest entry by window + GRACE_MS. It expires GRACE_MS after
      -- the end of the aligned window following the newest entry's, set when an entry first
      -- lands in a new aligned window: entries in the same aligned window need no PEXPIRE.
      local w = a.window
      local k = math.floor(t / w)
      if not e or k ~= math.floor(e[4] / w) then
        redis.call('PEXPIRE', key, (k + 2) * w + GRACE_MS - now)
      end
    end,
    release = function(key, now, a)
      local e, used = a.st, a.used
      local left = a.hits
      local released = 0
      if e and left > 0 then
        local raw, first, last, step
        if release_oldest then
          raw = redis.call('ZRANGE', key, 0, left - 1, 'WITHSCORES')
          first, last, step = 1, #raw - 1, 2
        else
          raw = redis.call('ZRANGE', key, -left, -1, 'WITHSCORES')
          first, last, step = #raw - 1, 1, -2
        end
        for i = first, last, step do
          local m, t = raw[i], raw[i + 1]
          local c, h = log_parse(m)
          local take = math.min(left, h)
          left = left - take
          released = released + take
          redis.call('ZREM', key, m)
          if h > take then
            if not release_oldest then c = c - take end
            redis.call('ZADD', key, t, string.format(LOG_MEMBER, c, h - take))
          end
          if left == 0 then break end
        end
      end
      return math.max(0, a.cap - (used - released))
    end,
  }
end
