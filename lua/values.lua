-- Counter values are numbers joined by ':' (e.g. "<window start>:<usage>:<debt>").
-- Returns the numbers of a key's value, or nil when the key is absent.
local function read_fields(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local out = {}
  for part in string.gmatch(v, '[^:]+') do out[#out + 1] = tonumber(part) end
  return out
end
