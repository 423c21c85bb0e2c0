"""The command line: the `rls` and `ratelimit` console scripts and every `rls` sub-command.

- `entry` (`rls`, `python -m rls`) and `ratelimit_entry` (`/bin/ratelimit`, configured by
  envoyproxy/ratelimit's environment): a Ctrl-C at any moment ends them quietly;
- `main`: the `rls` parser, built from the sub-commands, and the run of the one named;
- one module per sub-command, each of the shape in `command` (NAME, add_parser, run):
  `serve`, `check_config`, `counters`, `usage`, `switches`, `cache`, `top`, `demo`, `replay`;
- `admin_client`: the one client of the admin API the admin sub-commands share;
- `hints`: a mistake on the command line answered by the sub-command meant, "did you mean".

This file imports nothing: the entries import the rest of the CLI inside their Ctrl-C guard,
and importing them runs this first.
"""
