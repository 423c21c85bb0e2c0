"""Issue 33, "small contradictions": what the docs say and what rls does agree.

Each test runs the behaviour and reads the sentence of the docs that describes it.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import http_get, wait_until
from support.net import free_port
from support.rls_cli import ROOT, rls

GOOD = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"


def flat(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def test_healthcheck_is_500_store_not_ready_with_a_config_and_no_store(
        rls_factory: Callable[..., object], tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text(GOOD)
    proc = rls_factory(cfg, args=("--redis-url", f"redis://127.0.0.1:{free_port()}/0"),
                       wait_healthy=False)
    url = proc.http_url + "/healthcheck"  # type: ignore[attr-defined]

    def answered() -> bool:
        try:
            return http_get(url)[0] != 0
        except OSError:  # the admin port is not open yet
            return False

    wait_until(answered, timeout=30.0, what="/healthcheck answers")
    assert http_get(url) == (500, b"store not ready\n")
    for doc in ("README.md", "docs/admin.md"):
        assert "store not ready" in flat(doc), doc


@pytest.mark.process
def test_serve_help_and_the_settings_table_list_every_log_level_accepted() -> None:
    from rls.settings import Settings
    from rls.settings.model import CHOICES, LOG_LEVEL_ALIASES

    help_text = " ".join(rls("serve", "--help").stdout.split())
    row = next(line for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
               if line.startswith("| `--log-level`"))
    for level in (*CHOICES["log_level"], *LOG_LEVEL_ALIASES):
        Settings(log_level=level).validate()  # accepted...
        assert level in help_text.split("--log-level", 2)[2][:200], level  # ...and listed
        assert f"`{level}`" in row, level


def test_serve_says_which_files_it_skipped_and_where_the_decision_log_goes(
        rls_factory: Callable[..., object], tmp_path: Path) -> None:
    directory = ROOT / "config"
    cache_files = sorted(str(directory / name) for name in ("cache-ssdb.yaml", "cache.yaml"))
    descriptors = [p for p in directory.glob("*.yaml") if str(p) not in cache_files]
    decisions = tmp_path / "decisions.jsonl"
    proc = rls_factory(directory, args=("--decision-log", str(decisions)))
    log = proc.log()  # type: ignore[attr-defined]
    assert (f"config loaded: {len(descriptors)} descriptor file(s)") in log, log
    assert (f"; 2 response-cache rules file(s) skipped (not descriptors; --cache-config reads "
            f"them): {', '.join(cache_files)}") in log, log
    assert f"decision log: writing to {decisions} (100% of callers;" in log, log


def test_rls_cache_purge_lists_the_apis_and_rls_cache_stats_shows_the_cache(
        rls_factory: Callable[..., object], tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text(GOOD)
    proc = rls_factory(cfg, args=("--cache-config", str(ROOT / "config" / "cache.yaml")))
    admin = proc.http_url  # type: ignore[attr-defined]
    nope = rls("cache", "purge", "--api", "nope", "--admin", admin)
    assert nope.returncode == 1
    assert nope.stderr.strip() == (
        "rls cache purge: HTTP 404: unknown api 'nope' (apis: items, translate)"
    ), nope.stderr
    stats = rls("cache", "stats", "--admin", admin)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["apis"] == ["items", "translate"]
    for doc in ("docs/cache.md", "docs/admin.md"):
        assert "rls cache stats" in flat(doc), doc


def test_rls_cache_stats_without_a_cache_says_so(rls_factory: Callable[..., object],
                                                 tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text(GOOD)
    proc = rls_factory(cfg)
    done = rls("cache", "stats", "--admin", proc.http_url)  # type: ignore[attr-defined]
    assert done.returncode == 1
    assert done.stderr.strip() == ("rls cache stats: HTTP 404: no response cache here: "
                                   "rls serve runs without --cache-config"), done.stderr


def test_an_admin_command_pointed_at_the_grpc_port_says_so_without_a_traceback(
        rls_factory: Callable[..., object], tmp_path: Path) -> None:
    """`--admin http://host:8081` (the gRPC port, not --http-addr's) is a first-week mistake:
    the answer is HTTP/2 frames, not HTTP/1.1."""
    cfg = tmp_path / "d.yaml"
    cfg.write_text(GOOD)
    proc = rls_factory(cfg)
    grpc = f"http://127.0.0.1:{proc.grpc_port}"  # type: ignore[attr-defined]
    done = rls("cache", "stats", "--admin", grpc)
    assert done.returncode == 2, done.stderr  # as when the address cannot be reached
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"rls cache stats: {grpc} does not answer HTTP/1.1 as the admin API does "
        "(is it the gRPC port? the admin API listens on --http-addr)"), done.stderr


@pytest.mark.process
def test_an_admin_command_pointed_at_another_http_server_says_so_without_a_traceback(
        tmp_path: Path) -> None:
    """An --admin URL that answers HTTP/1.1 with a page, not JSON (a proxy, another service):
    one line naming the address, exit 2, no ValueError traceback."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "stats").write_text("<html>not rls</html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        admin = f"http://127.0.0.1:{server.server_address[1]}"
        done = rls("cache", "stats", "--admin", admin)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"rls cache stats: {admin} answers /cache/stats with something other than JSON: it is "
        "not rls's admin API (that listens on --http-addr)"), done.stderr
