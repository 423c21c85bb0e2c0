"""`/bin/ratelimit`: rls started the way envoyproxy/ratelimit is, from its environment alone.

Envoy Gateway runs its rate-limit Deployment as `Command: ["/bin/ratelimit"]`, no arguments,
everything in the reference's variables; the image links this console script there. It runs
`rls serve` with the flags rls.settings.reference_env.plan derives from those variables (see
docs/envoy-gateway.md). Arguments are refused: they would mean a different program.
"""

from __future__ import annotations

import sys

from rls.cli.entry import INTERRUPTED

USAGE = (
    "usage: ratelimit (no arguments: configured by envoyproxy/ratelimit's environment "
    "variables, see docs/envoy-gateway.md; for flags, run `rls serve`)"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        from rls.cli.reference_help import entry_help

        print(entry_help(USAGE))
        return 0
    if args:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        from rls.settings.environment import quiet_grpc_core

        quiet_grpc_core()  # before grpc is imported
        from rls.cli.main import main as cli_main
        from rls.settings.reference_env import plan

        entry = plan()
        if entry.problem is not None:
            print(f"ratelimit: {entry.problem}", file=sys.stderr)
            return 2
        return cli_main(entry.argv, entry.notes)
    except KeyboardInterrupt:
        return INTERRUPTED
