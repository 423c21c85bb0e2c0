-- Concurrency: in-flight leases; releases take the oldest, lost releases expire after one unit.
ALGOS[7] = log_algo(true)
