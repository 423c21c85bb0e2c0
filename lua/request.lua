-- The request arguments lua/decide.lua reads (included before it by rls/stores/scripts.py).
-- ARGV[1]: now in ms, or '' for Redis TIME (one clock for all replicas). ARGV[2]: mode.
-- ARGV[3]: the checks' packed parameters.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local mode = ARGV[2]
local params = ARGV[3]
