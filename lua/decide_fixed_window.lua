-- The lean path: a request whose checks are all plain fixed windows without flags (epoch
-- windows, no overdraft, not rolling, no shadow/quota/release), the common request. Each such
-- counter is a plain integer in a key of its own window, `<counter key>@<window index>`, the
-- window chosen by the client on the store's clock (rls/stores/windows.py). A decision charges
-- first and looks after: one INCRBY per check (PEXPIRE only when it created the window's key),
-- fewer commands than envoyproxy/ratelimit's INCRBY+EXPIRE; a request with a full check gives
-- its charges back (DECRBY), so it is still decided all-or-nothing (atomically: one script).
-- No TIME, no value to parse or format: every Lua instruction here costs Redis CPU on every
-- decision (measured in benchmarks/redis_cost.py and benchmarks/redis_batch.py).
--
-- KEYS[i]: counter key of check i's current window. n = #KEYS.
-- ARGV[1]: 'd' decide and charge, 'e' evaluate only.
-- ARGV[1 + i]: the most check i's counter may hold for the request to pass
--   (limit - max(hits, 1): a 0-hit check asks for room for one more).
-- ARGV[1 + n + i]: hits of check i. ARGV[1 + 2n + i]: the expiry (ms) of a key the charge creates.
-- Returns the counters as they were before this request (false or 0: none yet); the client
-- derives every outcome and the admission from them and its own arguments
-- (rls/stores/scripts.py `lean_verdict`). 'e' only reads them (MGET).
local n = #KEYS
if n == 0 then return {} end
if ARGV[1] ~= 'd' then return redis.call('MGET', unpack(KEYS)) end
local before = {}
local fits = true
for i = 1, n do
  local hits = ARGV[1 + n + i]
  local was = redis.call('INCRBY', KEYS[i], hits) - hits
  if was == 0 then redis.call('PEXPIRE', KEYS[i], ARGV[1 + 2 * n + i]) end
  before[i] = was
  if was - ARGV[1 + i] > 0 then fits = false end
end
if not fits then  -- one check is full: the request is rejected and charges nothing
  for i = 1, n do redis.call('DECRBY', KEYS[i], ARGV[1 + n + i]) end
end
return before
