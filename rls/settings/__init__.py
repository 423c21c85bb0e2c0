"""What a deployment sets, from flags or the environment, checked once at start.

- `model`: `Settings` (every setting, its default and why), the rules its values follow, and
  `validate`;
- `environment`: every read of the process environment (a setting's `RLS_<NAME>` and the
  reference's name for it; RLS_ADMIN_TOKEN, RLS_QUOTA_*, the `--workers` protocol, what
  libraries read);
- `forms`: the written forms of values (booleans, Go durations, `k1:v1,k2:v2` lists);
- `reference_env`: envoyproxy/ratelimit's variables turned into an `rls serve` command line,
  for the `ratelimit` entry.

`Settings` and `SettingError`, which every layer passes around, are imported from here.
"""

from rls.settings.model import SettingError, Settings

__all__ = ["SettingError", "Settings"]
