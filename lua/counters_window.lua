-- Frequency counters (rls/counters): charge or read many counters in one call.
--
-- KEYS[i]   the counter's base key, "<prefix>c{...}" (the braces are the Cluster hash tag, so
--           the window suffix appended here stays in the declared key's slot).
-- ARGV[1]   "a" add, "g" get
-- ARGV[2]   now in ms, "" to use the store's clock (TIME): calendar bounds follow the store
-- ARGV[3]   pub/sub channel for hot-key invalidation, "" for none (Add publishes each base key)
-- ARGV[2+2i]   "c,hits,b0,b1,b2,b3" (calendar: the store picks the window holding its time)
--              or "r,hits,length_ms" (rolling from the first hit)
-- ARGV[3+2i]   the original key, stored in field "k" when the key is hashed ("" otherwise)
-- A counter is a hash {c = count, k = original key}; it expires when its window ends.
--
-- Reply: {now_ms, then per item: code, freq, ttl_ms, message}
--   code 0 ok, 1 the store's time is outside the given bounds (caller retries with them
--   computed from now_ms), 2 the store refused this item (message says why; Add not charged).
local mode = ARGV[1]
local now
if ARGV[2] ~= "" then
  now = tonumber(ARGV[2])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local channel = ARGV[3]
local out = {now}

local function failed(res)
  return type(res) == "table" and res.err ~= nil
end

for i, base in ipairs(KEYS) do
  local spec = ARGV[2 + 2 * i]
  local orig = ARGV[3 + 2 * i]
  local f = {}
  for part in string.gmatch(spec, "[^,]+") do
    f[#f + 1] = part
  end
  local hits = tonumber(f[2])
  local code, freq, ttl, msg = 0, 0, 0, ""
  if f[1] == "c" then
    local start, stop
    for j = 3, 5 do
      local lo, hi = tonumber(f[j]), tonumber(f[j + 1])
      if now >= lo and now < hi then
        start, stop = lo, hi
      end
    end
    if start == nil then
      code = 1
    else
      local key = base .. ":" .. start
      ttl = stop - now
      local res
      if mode == "a" then
        res = redis.pcall("HINCRBY", key, "c", hits)
        if not failed(res) and res == hits then
          redis.call("PEXPIRE", key, stop - now) -- relative: also right with an injected now
          if orig ~= "" then
            redis.call("HSET", key, "k", orig)
          end
        end
      else
        res = redis.pcall("HGET", key, "c")
      end
      if failed(res) then
        code, msg = 2, res.err
      else
        freq = tonumber(res) or 0
      end
    end
  else
    local key = base .. ":r"
    local length = tonumber(f[3])
    local res
    if mode == "a" then
      res = redis.pcall("HINCRBY", key, "c", hits)
      if not failed(res) and res == hits then
        redis.call("PEXPIRE", key, length)
        if orig ~= "" then
          redis.call("HSET", key, "k", orig)
        end
      end
    else
      res = redis.pcall("HGET", key, "c")
    end
    if failed(res) then
      code, msg = 2, res.err
    else
      freq = tonumber(res) or 0
      if freq > 0 then
        ttl = redis.call("PTTL", key)
        if ttl < 0 then -- lost its expiry (restored without TTL): the window restarts now
          redis.call("PEXPIRE", key, length)
          ttl = length
        end
      end
    end
  end
  if mode == "a" and code == 0 and channel ~= "" then
    redis.call("PUBLISH", channel, base)
  end
  out[#out + 1] = code
  out[#out + 1] = freq
  out[#out + 1] = ttl
  out[#out + 1] = msg
end
return out
