-- The lean path for several requests at once: the requests one loop turn queued on the lean
-- connection (rls/stores/redis.py `LeanBatcher`), each decided all-or-nothing exactly as
-- lua/decide_fixed_window.lua decides one, in the order given, in one EVALSHA: Redis pays its
-- per-command cost (parsing, script lookup, the Lua call) once for the batch.
--
-- KEYS: every request's keys, request after request.
-- ARGV[1]: the number of requests r. ARGV[1 + j]: request j's number of checks n_j.
-- Then, request after request, its lean arguments: mode ('d' decide and charge, 'e'
-- evaluate), the room of each check, the hits of each check, the expiry (ms) of a key a charge
-- creates (as lua/decide_fixed_window.lua's ARGV[1..1+3n]).
-- Returns every request's counters as they were before it (false or 0: none yet), request
-- after request: a request sees what the requests before it in the batch charged.
local r = tonumber(ARGV[1])
local out = {}
local k = 0      -- keys of the requests before this one
local a = 1 + r  -- arguments of the requests before this one
for j = 1, r do
  local n = tonumber(ARGV[1 + j])
  if ARGV[a + 1] == 'd' then
    local fits = true
    for i = 1, n do
      local key = KEYS[k + i]
      local hits = ARGV[a + 1 + n + i]
      local was = redis.call('INCRBY', key, hits) - hits
      if was == 0 then redis.call('PEXPIRE', key, ARGV[a + 1 + 2 * n + i]) end
      out[k + i] = was
      if was - ARGV[a + 1 + i] > 0 then fits = false end
    end
    if not fits then
      for i = 1, n do redis.call('DECRBY', KEYS[k + i], ARGV[a + 1 + n + i]) end
    end
  else
    local vals = redis.call('MGET', unpack(KEYS, k + 1, k + n))
    for i = 1, n do out[k + i] = vals[i] end
  end
  k = k + n
  a = a + 1 + 3 * n
end
return out
