"""The shared running rls of tests/support/served.py, for the tests of metrics and logs."""

from support.served import (  # noqa: F401 - fixtures, found by pytest in this module
    ops_redis,
    shared_config,
    spawner,
    srv,
    switches_reset,
    workers_srv,
)
