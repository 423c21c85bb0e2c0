-- The lean path: decide a request whose checks are all plain fixed windows (epoch-aligned, no
-- overdraft, no calendar). Same admission rule and stored values as decide.lua with
-- fixed_window.lua (value "<window start ms>:<usage>:<debt>", expiring GRACE_MS after the
-- window), without its generality: no algorithm table, no per-check tables, no flag arithmetic
-- for checks without flags, parameters unpacked by struct (no string patterns), a compact
-- reply; one GET per check and one SET per charged check. A value already of this window keeps
-- its expiry (SET … KEEPTTL, Redis >= 6.0): the window's end does not move.
--
-- KEYS[i]: counter key of check i. ARGV[1]: now in ms, or '' for Redis TIME. ARGV[2]: mode,
-- as in decide.lua. ARGV[3]: per check 4 little-endian doubles: flags, hits, limit, window ms.
-- Returns {admitted, now, then per check: used * 4 + ok * 2 + charged}; the client derives
-- remaining and reset from these (rls/stores/scripts.py `lean_verdict`).
-- now, mode and params: lua/request.lua (read once, shared by every decide script).
local unpack4 = struct.unpack
local n = #KEYS

-- One check without flags, the most common request: its verdict is the request's.
if n == 1 then
  local f, hits, cap, window = unpack4('<dddd', params)
  if f == 0 then
    local start = now - now % window
    local key = KEYS[1]
    local usage, debt, same = 0, 0, false
    local v = redis.call('GET', key)
    if v then
      local vs, vu, vd = string.match(v, '^(%d+):(%d+):(%d+)$')
      if tonumber(vs) == start then usage, debt, same = tonumber(vu), tonumber(vd), true end
    end
    local ok
    if hits == 0 then ok = usage < cap else ok = usage + hits <= cap end
    local admitted = ok
    if mode == 'a' then admitted = true elseif mode == 'r' then admitted = false end
    if ok and admitted and mode ~= 'e' then
      local value = string.format('%d:%d:%d', start, usage + hits, debt)
      if same then
        redis.call('SET', key, value, 'KEEPTTL')
      else
        redis.call('SET', key, value, 'PX', start + window + GRACE_MS - now)
      end
      return {admitted and 1 or 0, now, usage * 4 + 3}
    end
    return {admitted and 1 or 0, now, usage * 4 + (ok and 2 or 0)}
  end
end

local band = bit.band
local st = {}  -- per check, 7 slots: flags, hits, limit, window start, window, usage, debt
local oks = {}
local pos = 1
local admitted, quota_seen, quota_room = true, false, false
for i = 1, n do
  local f, hits, cap, window
  f, hits, cap, window, pos = unpack4('<dddd', params, pos)
  local start = now - now % window
  local usage, debt = 0, -1  -- debt -1: no value of this window yet
  local v = redis.call('GET', KEYS[i])
  if v then
    local vs, vu, vd = string.match(v, '^(%d+):(%d+):(%d+)$')
    if tonumber(vs) == start then usage, debt = tonumber(vu), tonumber(vd) end
  end
  local ok
  if hits == 0 then ok = usage < cap else ok = usage + hits <= cap end
  local o = i * 7 - 7
  st[o + 1], st[o + 2], st[o + 3], st[o + 4], st[o + 5], st[o + 6], st[o + 7] =
    f, hits, cap, start, window, usage, debt
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

local res = {admitted and 1 or 0, now}
local charging = mode ~= 'e'
for i = 1, n do
  local o = i * 7 - 7
  local f, hits, usage = st[o + 1], st[o + 2], st[o + 6]
  local ok = oks[i]
  local charge
  if f == 0 then
    charge = charging and admitted and ok
  else
    charge = charging and (band(f, NEGATIVE + CHARGE_ALWAYS) ~= 0
      or (admitted and (ok or band(f, SHADOW) ~= 0)))
  end
  if charge then
    local after = usage + hits
    if f ~= 0 and band(f, NEGATIVE) ~= 0 then
      after = math.max(0, usage - hits)
      ok = true
    end
    local debt = st[o + 7]
    if debt >= 0 then
      redis.call('SET', KEYS[i], string.format('%d:%d:%d', st[o + 4], after, debt), 'KEEPTTL')
    else
      redis.call('SET', KEYS[i], string.format('%d:%d:0', st[o + 4], after),
        'PX', st[o + 4] + st[o + 5] + GRACE_MS - now)
    end
  end
  res[i + 2] = usage * 4 + (ok and 2 or 0) + (charge and 1 or 0)
end
return res
