-- Sliding log (exact): never more than the limit in any window; releases take the newest.
return log_algo(false)
