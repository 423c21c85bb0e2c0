-- The lean path: a request whose checks are all plain fixed windows without flags (epoch
-- windows, no overdraft, not rolling, no shadow/quota/release), the common request. Each such
-- counter is a plain integer in a key of its own window, `<counter key>@<window index>`, the
-- window chosen by the client on the store's clock (rls/stores/windows.py): a check is one read
-- and a charge one INCRBY, as in envoyproxy/ratelimit's INCRBY+EXPIRE, and the request is still
-- decided all-or-nothing. No TIME, no value to parse or format, no table built: every Lua
-- instruction here costs Redis CPU on every decision (measured in benchmarks/redis_cost.py).
--
-- KEYS[i]: counter key of check i's current window. n = #KEYS.
-- ARGV[1]: 'd' decide and charge, 'e' evaluate only.
-- ARGV[1 + i]: the most check i's counter may hold for the request to pass
--   (limit - max(hits, 1): a 0-hit check asks for room for one more).
-- ARGV[1 + n + i]: hits of check i. ARGV[1 + 2n + i]: the expiry (ms) of a key the charge creates.
-- Returns the counters as read (false: none yet); the client derives every outcome and the
-- admission from them and its own arguments (rls/stores/scripts.py `lean_verdict`).
local n = #KEYS
if n == 0 then return {} end
local vals = redis.call('MGET', unpack(KEYS))
for i = 1, n do
  if (vals[i] or 0) - ARGV[1 + i] > 0 then return vals end  -- one check is full: rejected
end
if ARGV[1] == 'd' then
  for i = 1, n do
    if vals[i] then
      redis.call('INCRBY', KEYS[i], ARGV[1 + n + i])
    else
      redis.call('SET', KEYS[i], ARGV[1 + n + i], 'PX', ARGV[1 + 2 * n + i])
    end
  end
end
return vals
