-- Decide one whole request atomically: evaluate every check, apply the admission rule
-- (mirror of rls/core/admission.py), then charge the selected checks. One EVALSHA per request.
-- rls/stores/scripts.py puts in front of this file the generated prelude (flag bits,
-- GRACE_MS) and only the algorithms the request uses, each registered in ALGOS by its id.
--
-- KEYS[i]: counter key of check i.
-- ARGV[1]: now in ms, or '' to use Redis TIME (one clock for all replicas).
-- ARGV[2]: mode. 'd' decide and charge; 'e' evaluate only (no charge); 'a' / 'r' charge as if
--   the request was admitted / rejected (Cluster: the admission was decided across slots).
-- ARGV[3]: the checks' parameters, 11 little-endian doubles per check (one argument: each
--   argument costs the client an encoding step; struct.unpack costs no string patterns):
--   algorithm id, flags, hits, limit, window ms, burst, overdraft, calendar window start, end,
--   previous start (0 0 0 for epoch windows), layout (fixed windows: FW_ROLLING, FW_COUNTER;
--   rls/stores/windows.py).
-- Candidate checks (flag CANDIDATE; the index of the live check they stand in for, their twin,
-- in the flag bits from TWIN_DIV up) never take part in the admission; in mode 'd' each is
-- charged as its twin would be with the candidate's verdict in its place (rls/core/admission.py).
-- In 'a' / 'r' (a Cluster request spanning slots, decided per slot) the twin may sit in another
-- slot's call: a candidate is then charged like a live check of the forced admission.
-- Returns {admitted, then per check: ok, charged, remaining, reset ms, used}.
-- now, mode and params: lua/request.lua (read once, shared by every decide script).
local unpack = struct.unpack
local pos = 1
local n = #KEYS
local args, res = {}, {}
local quota_seen, quota_room, failing = false, 0, 0
for i = 1, n do
  local id, f, hits, cap, window, burst, overdraft, start, stop, prev, layout
  id, f, hits, cap, window, burst, overdraft, start, stop, prev, layout, pos =
    unpack('<ddddddddddd', params, pos)
  -- Every field the algorithms set is in the constructor: the table is sized once, not
  -- rehashed as fields are added (each rehash costs Redis CPU on every decision).
  local a = {
    algo = ALGOS[id], flags = f, hits = hits, cap = cap, window = window,
    burst = burst, overdraft = overdraft, start = start, stop = stop, prev = prev,
    layout = layout, ok = false, rem_charged = 0, rem_uncharged = 0, reset = 0, used = 0,
    st = false, impl = false,
  }
  a.ok, a.rem_charged, a.rem_uncharged, a.reset, a.used = a.algo.evaluate(KEYS[i], now, a)
  args[i] = a
  local f = a.flags
  if bit.band(f, NEGATIVE + CANDIDATE) == 0 then
    if bit.band(f, QUOTA) ~= 0 then
      quota_seen = true
      if a.ok or bit.band(f, SHADOW) ~= 0 then quota_room = quota_room + 1 end
    elseif not a.ok and bit.band(f, SHADOW) == 0 then
      failing = failing + 1
    end
  end
end
local admitted = failing == 0 and (not quota_seen or quota_room > 0)
if mode == 'a' then admitted = true elseif mode == 'r' then admitted = false end

-- Whether the request would be admitted with candidate `a`'s verdict in place of its twin's.
local function would_admit(a)
  local f = a.flags
  local shadow = bit.band(f, SHADOW) ~= 0
  local twin_ok = args[math.floor(f / TWIN_DIV) + 1].ok
  if bit.band(f, QUOTA) ~= 0 then
    local room = quota_room - ((twin_ok or shadow) and 1 or 0) + ((a.ok or shadow) and 1 or 0)
    return failing == 0 and room > 0
  end
  local fails = failing
  if not shadow then
    fails = fails + (a.ok and 0 or 1) - (twin_ok and 0 or 1)
  end
  return fails == 0 and (not quota_seen or quota_room > 0)
end

res[1] = admitted and 1 or 0
for i = 1, n do
  local a = args[i]
  local f = a.flags
  local charge
  if mode == 'e' then
    charge = false
  elseif bit.band(f, NEGATIVE + CHARGE_ALWAYS) ~= 0 then
    charge = true
  elseif mode == 'd' and bit.band(f, CANDIDATE) ~= 0 then
    charge = would_admit(a) and (a.ok or bit.band(f, SHADOW) ~= 0)
  else
    charge = admitted and (a.ok or bit.band(f, SHADOW) ~= 0)
  end
  local o = 2 + (i - 1) * 5
  local ok, remaining = a.ok, 0
  if charge then
    if bit.band(f, NEGATIVE) ~= 0 then
      remaining = a.algo.release(KEYS[i], now, a)
      ok = true
    else
      a.algo.charge(KEYS[i], now, a)
      remaining = a.rem_charged
    end
  elseif ok then
    remaining = a.rem_uncharged
  end
  res[o] = ok and 1 or 0
  res[o + 1] = charge and 1 or 0
  res[o + 2] = remaining
  res[o + 3] = a.reset
  res[o + 4] = a.used
end
return res
