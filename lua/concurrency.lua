-- Concurrency: in-flight leases; releases take the oldest, lost releases expire after one unit.
return log_algo(true)
