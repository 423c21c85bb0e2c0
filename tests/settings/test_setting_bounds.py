"""Numeric settings are bounded on both sides and must be finite.

`nan` compares false with every bound, so `--reload-interval nan` used to start; a huge
`--max-request-bytes` overflowed grpc's channel arguments (traceback, exit 1), a huge
`--probe-timeout-ms` left a probe thread that SIGTERM could not stop, and a huge `--workers`
allocated a slot per worker before starting any.
"""

from __future__ import annotations

import pytest
from support.rls_cli import ROOT, rls

from rls.settings import SettingError, Settings

HUGE = 10**23


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("reload_interval", float("nan"), "is not a finite number"),
        ("reload_interval", float("inf"), "is not a finite number"),
        ("drain_seconds", float("nan"), "is not a finite number"),
        ("xds_backoff_max", float("inf"), "is not a finite number"),
        ("workers", HUGE, "is above the maximum 1024"),
        ("probe_timeout_ms", HUGE, "is above the maximum"),
        ("probe_interval_ms", HUGE, "is above the maximum"),
        ("max_request_bytes", HUGE, "is above the maximum"),
        ("backend_timeout_ms", HUGE, "is above the maximum"),
    ],
)
def test_non_finite_or_huge_numeric_setting_is_a_setting_error(
    name: str, value: float, says: str
) -> None:
    settings = Settings(config=[str(ROOT / "config")], **{name: value})
    with pytest.raises(SettingError) as caught:
        settings.validate()
    assert caught.value.name == name
    assert says in caught.value.message


def test_largest_allowed_values_still_validate() -> None:
    Settings(config=[str(ROOT / "config")], workers=1024, max_request_bytes=256 << 20,
             reload_interval=86400, probe_timeout_ms=2**31 - 1).validate()


@pytest.mark.process
@pytest.mark.parametrize(
    ("env", "named"),
    [({"RLS_MAX_REQUEST_BYTES": str(HUGE)}, "RLS_MAX_REQUEST_BYTES"),
     ({"RLS_RELOAD_INTERVAL": "nan"}, "RLS_RELOAD_INTERVAL")],
)
def test_bad_number_from_the_environment_is_one_line_exit_2(
    env: dict[str, str], named: str
) -> None:
    done = rls("serve", "--config", str(ROOT / "config"), "--grpc-addr", "127.0.0.1:1",
               "--http-addr", "127.0.0.1:1", env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"rls: {named}: "), done.stderr
