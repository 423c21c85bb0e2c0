-- Frequency counters (rls/counters): charge or read many counters in one call.
--
-- KEYS[i]  the counter's base key, "<prefix>c{...}" (the braces are the Cluster hash tag, so
--          the window suffix appended here stays in the declared key's slot).
-- ARGV[1]  "a" add, "g" get
-- ARGV[2]  now in ms, "" to use the store's clock (TIME): calendar bounds follow the store
-- ARGV[3]  pub/sub channel prefix for hot-key invalidation, "" for none (Add publishes on
--          <prefix><base key>: only replicas caching that counter subscribe to it)
-- ARGV[4]  calendar bound sets "b0,b1,b2,b3;b0,…": edges of the previous, current and next
--          windows computed from the caller's clock; the store picks the one holding its time
-- ARGV[5]  one spec per key, ";"-separated: "c,hits,set,h" (calendar, index of its bound set)
--          or "r,hits,length_ms,h" (rolling from the first hit); h = 1 when the key is hashed
-- ARGV[6…] the original keys of the hashed items, in order (stored in field "k" for listings)
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
local add = mode == "a"
local out = {now}

-- The window (start, stop) of each bound set at the store's time; false when outside.
local windows = {}
for set in string.gmatch(ARGV[4], "[^;]+") do
  local b = {}
  for edge in string.gmatch(set, "[^,]+") do
    b[#b + 1] = tonumber(edge)
  end
  local w = false
  for j = 1, 3 do
    if now >= b[j] and now < b[j + 1] then
      w = {b[j], b[j + 1]}
    end
  end
  windows[#windows + 1] = w
end

local function failed(res)
  return type(res) == "table" and res.err ~= nil
end

local i, orig_at = 0, 6
for kind, hits, arg, hashed in string.gmatch(ARGV[5], "(%a),(%d+),(%d+),(%d)") do
  i = i + 1
  local base = KEYS[i]
  hits = tonumber(hits)
  local orig = ""
  if hashed == "1" then
    orig = ARGV[orig_at]
    orig_at = orig_at + 1
  end
  local code, freq, ttl, msg = 0, 0, 0, ""
  local key, length, res
  if kind == "c" then
    local w = windows[tonumber(arg) + 1]
    if not w then
      code = 1
    else
      key = base .. ":" .. w[1]
      ttl = w[2] - now
      length = ttl -- relative expiry: also right with an injected now
    end
  else
    key = base .. ":r"
    length = tonumber(arg)
  end
  if key then
    if add then
      res = redis.pcall("HINCRBY", key, "c", hits)
      if not failed(res) and res == hits then -- a new window
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
      if kind == "r" and freq > 0 then
        ttl = redis.call("PTTL", key)
        if ttl < 0 then -- lost its expiry (restored without TTL): the window restarts now
          redis.call("PEXPIRE", key, length)
          ttl = length
        end
      end
    end
  end
  if add and code == 0 and channel ~= "" then
    redis.call("PUBLISH", channel .. base, "")
  end
  out[#out + 1] = code
  out[#out + 1] = freq
  out[#out + 1] = ttl
  out[#out + 1] = msg
end
return out
