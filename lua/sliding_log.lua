-- Sliding log (exact): never more than the limit in any window; releases take the newest.
ALGOS[3] = log_algo(false)
