-- Leased counters (rls/stores/redis/leases.py): a process takes tokens of a plain fixed
-- window's counter (`<counter key>@<window index>`, rls/stores/windows.py) ahead of its
-- requests, and gives back what it did not hand out. The counter holds every token taken, so
-- processes deciding per call (the lean script) and processes holding leases share one count,
-- and the counter never holds more than the limit through a lease.
--
-- A record beside the counter (KEYS[2], a hash in the counter's hash slot: holder -> tokens
-- taken and not given back) is the proof a give-back needs: tokens go back only to a counter
-- that still holds them. After a restart, a flush, a failover to a replica that missed the
-- write, or an expired key, the record is gone with the counter, the give-back does nothing
-- (the room was never dealt by this counter), and `lost` tells the holder to drop what it
-- still holds instead of dealing it on top of a fresh count.
--
-- KEYS[1]: the window's counter. KEYS[2]: its lease record.
-- ARGV[1]: holder id. ARGV[2]: tokens wanted (0: give back only). ARGV[3]: the limit.
-- ARGV[4]: PX of a counter this call creates (to its window's end plus grace).
-- ARGV[5]: tokens to give back first. ARGV[6]: what the holder believes its record holds.
-- Returns {granted, counter after the call, lost (1/0), given back}.
local holder = ARGV[1]
local want = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local px = ARGV[4]
local back = tonumber(ARGV[5])
local held = tonumber(redis.call('HGET', KEYS[2], holder) or '0')
local lost = 0
if held < tonumber(ARGV[6]) then lost = 1 end
local counter = tonumber(redis.call('GET', KEYS[1]) or '0')
local given = 0
if back > 0 and held > 0 and counter > 0 then
  given = math.min(back, held, counter)
  counter = redis.call('DECRBY', KEYS[1], given)
  held = redis.call('HINCRBY', KEYS[2], holder, -given)
  if held <= 0 then redis.call('HDEL', KEYS[2], holder) end
end
local granted = 0
if want > 0 and counter < limit then
  granted = math.min(want, limit - counter)
  counter = redis.call('INCRBY', KEYS[1], granted)
  if counter == granted then redis.call('PEXPIRE', KEYS[1], px) end
  redis.call('HINCRBY', KEYS[2], holder, granted)
  redis.call('PEXPIRE', KEYS[2], px)
end
return {granted, counter, lost, given}
