-- The lean path: decide a request whose checks are all plain fixed windows (epoch-aligned, no
-- overdraft, no calendar). Same admission rule, results and stored values as decide.lua with
-- fixed_window.lua (value "<window start ms>:<usage>:<debt>", expiring GRACE_MS after the
-- window), without its generality: no algorithm table, no per-check tables, no flag arithmetic
-- for checks without flags; one GET per check and one SET per charged check.
--
-- KEYS[i]: counter key of check i. ARGV[1]: now in ms, or '' for Redis TIME. ARGV[2]: mode,
-- as in decide.lua. ARGV[3]: 4 numbers per check joined by ',': flags, hits, limit, window ms.
-- Returns {admitted, then per check: ok, charged, remaining, reset ms, used}.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local mode = ARGV[2]
local params = ARGV[3]
local band = bit.band
local n = #KEYS
local st = {}  -- per check, 7 slots: flags, hits, limit, window start, window end, usage, debt
local oks = {}
local pos = 1
local admitted, quota_seen, quota_room = true, false, false
for i = 1, n do
  local _, e, a, b, c, d = string.find(params, '^(%d+),(%d+),(%d+),(%d+),?', pos)
  pos = e + 1
  local f, hits, cap, window = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
  local start = now - now % window
  local usage, debt = 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local vs, vu, vd = string.match(v, '^(%d+):(%d+):(%d+)$')
    if tonumber(vs) == start then usage, debt = tonumber(vu), tonumber(vd) end
  end
  local ok
  if hits == 0 then ok = usage < cap else ok = usage + hits <= cap end
  local o = i * 7 - 7
  st[o + 1], st[o + 2], st[o + 3], st[o + 4], st[o + 5], st[o + 6], st[o + 7] =
    f, hits, cap, start, start + window, usage, debt
  oks[i] = ok
  if f == 0 then
    if not ok then admitted = false end
  elseif band(f, NEGATIVE) == 0 then
    if band(f, QUOTA) ~= 0 then
      quota_seen = true
      if ok or band(f, SHADOW) ~= 0 then quota_room = true end
    elseif not ok and band(f, SHADOW) == 0 then
      admitted = false
    end
  end
end
if quota_seen and not quota_room then admitted = false end
if mode == 'a' then admitted = true elseif mode == 'r' then admitted = false end

local res = {admitted and 1 or 0}
local r = 1
local charging = mode ~= 'e'
for i = 1, n do
  local o = i * 7 - 7
  local f, hits, cap, stop, usage = st[o + 1], st[o + 2], st[o + 3], st[o + 5], st[o + 6]
  local ok = oks[i]
  local charge
  if f == 0 then
    charge = charging and admitted and ok
  else
    charge = charging and (band(f, NEGATIVE + CHARGE_ALWAYS) ~= 0
      or (admitted and (ok or band(f, SHADOW) ~= 0)))
  end
  local remaining = 0
  if charge then
    local after = usage + hits
    if f ~= 0 and band(f, NEGATIVE) ~= 0 then
      after = math.max(0, usage - hits)
      ok = true
    end
    remaining = math.max(0, cap - after)
    redis.call('SET', KEYS[i], string.format('%d:%d:%d', st[o + 4], after, st[o + 7]),
      'PX', stop + GRACE_MS - now)
  elseif ok then
    remaining = math.max(0, cap - usage)
  end
  res[r + 1], res[r + 2], res[r + 3], res[r + 4], res[r + 5] =
    ok and 1 or 0, charge and 1 or 0, remaining, stop - now, usage
  r = r + 5
end
return res
