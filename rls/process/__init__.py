"""One running rls, and the `--workers` supervisor that runs several.

- `server`: the parts of one process (`build_app`: the decision path without listeners),
  started in order by `Server` (config, store, services, listeners), drained on SIGTERM;
- `listeners`: the HTTP listeners (admin API, Prometheus-only) and why a listener could not
  open, naming its flag;
- `workers`: `rls serve --workers N` (the supervisor), and a worker's side of it (readiness,
  the supervisor's slot report for health and /metrics, dying with the supervisor);
- `gc_tuning`: Python's garbage collector kept off the request path.

Above everything that serves (admin, services, frequency, tracing, grpc_access); only the
command line (rls.cli) imports it.
"""
