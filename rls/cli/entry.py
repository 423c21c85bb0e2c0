"""The `rls` command's entry point (and `python -m rls`'s): Ctrl-C ends any sub-command
quietly, at any moment.

Importing the CLI takes a noticeable fraction of a second (grpcio, the config and cache
modules); a Ctrl-C in that time would otherwise print a KeyboardInterrupt traceback. This module
imports nothing of rls before its `try` (nor does rls.cli's `__init__`, which importing it runs
first), so the import itself is inside it. Exit 130 (128 + SIGINT), as a shell reports a command
stopped by Ctrl-C; the sub-commands answer their own Ctrl-C (0).
"""

from __future__ import annotations

INTERRUPTED = 130


def main() -> int:
    try:
        from rls.settings.environment import quiet_grpc_core

        quiet_grpc_core()  # before grpc is imported
        from rls.cli.main import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return INTERRUPTED
