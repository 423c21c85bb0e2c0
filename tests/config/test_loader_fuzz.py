"""Fuzz the config loader on generated directory layouts (issue 14 item 6, DESIGN §10).

Each example builds a config directory from generated entries: schema-shaped and random YAML
trees (with anchors, aliases, tags spliced in), alias bombs, deep nesting, binary junk, empty
and oversized files, cache-rule files, FIFOs, sockets, symlinks to other entries, to the
directory itself, to a parent, to themselves, dangling ones, and nested subdirectories. Then:

- `load_paths` ends within the budget, in a config or one ConfigError line naming a file
  under the directory; nothing else escapes;
- a running ConfigHolder whose directory is swapped for the generated one either loads it or
  keeps the previous config, which still answers a rate-limit call.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rls.config.errors import ConfigError
from rls.config.loader import LoadBudget, load_paths
from rls.config.model import RateLimitConfig
from rls.config.reload import ConfigHolder
from rls.engine.limiter import OK, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

from .test_config_fuzz import ANY, CONFIG, dump, spliced

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Small budgets so that the budget paths are exercised; a hang is anything past HANG.
BUDGET = dict(max_file_bytes=64 * 1024, max_total_bytes=256 * 1024, max_nodes=20_000,
              max_depth=60, file_seconds=2.0, load_seconds=5.0)
HANG = 20.0

GOOD = """domain: known
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
"""


def bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [x, y]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\ndomain: b\ndescriptors: *a{levels}\n"


TEXTS = st.one_of(
    CONFIG.map(lambda doc: dump(doc, True)),
    ANY.map(lambda doc: dump(doc, False)),
    spliced(st.one_of(CONFIG, ANY)),
    st.builds(bomb, st.integers(1, 9), st.integers(1, 12)),
    st.integers(1, 400).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 200).map(lambda n: "domain: d\ndescriptors: " + "[{key: k, descriptors: " * n
                            + "[]" + "}]" * n),
    st.just("domain: d\ndescriptors: &a [ {key: k, descriptors: *a} ]\n"),
    st.just("rules:\n  - api: translate\n"),
    st.just("domain: !!float ;\n"),
    st.just(""),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
)
NAMES = st.sampled_from(["a.yaml", "b.yml", "c.yaml", "d.yaml", ".hidden.yaml", "e.txt",
                         "f.yaml", "g.yaml"])
ENTRY = st.one_of(
    st.tuples(st.just("file"), NAMES, TEXTS),
    st.tuples(st.just("big"), NAMES, st.just("")),
    st.tuples(st.just("fifo"), NAMES, st.just("")),
    st.tuples(st.just("socket"), NAMES, st.just("")),
    st.tuples(st.just("link"), NAMES,
              st.sampled_from(["a.yaml", "missing.yaml", ".", "..", "sub", "self.yaml",
                               "../..", "sub/a.yaml"])),
    st.tuples(st.just("dir"), st.sampled_from(["sub", "sub2", "..data"]), st.just("")),
)
LAYOUT = st.lists(ENTRY, max_size=8)


def build(root: Path, layout: list[tuple[str, str, str]], depth: int = 0) -> list[socket.socket]:
    """Create the entries under root; returns bound sockets to close afterwards."""
    keep: list[socket.socket] = []
    root.mkdir(parents=True, exist_ok=True)
    for kind, name, arg in layout:
        path = root / name
        if path.exists() or path.is_symlink():
            continue
        if kind == "file":
            path.write_text(arg, encoding="utf-8", errors="surrogateescape")
        elif kind == "big":
            path.write_text("domain: big\n# " + "x" * (BUDGET["max_file_bytes"] + 10) + "\n")
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            if len(str(path)) < 100:  # AF_UNIX path limit
                sock = socket.socket(socket.AF_UNIX)
                sock.bind(str(path))
                keep.append(sock)
        elif kind == "link":
            os.symlink(path.name if arg == "self.yaml" else arg, path)
        elif kind == "dir" and depth < 2:
            keep += build(path, layout[:3], depth + 1)
    return keep


def load_in_thread(root: Path) -> RateLimitConfig | ConfigError:
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["out"] = load_paths([str(root)], budget=LoadBudget(**BUDGET))
        except BaseException as exc:  # judged below
            box["out"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), f"load hung for {HANG} s"
    out = box["out"]
    if isinstance(out, BaseException) and not isinstance(out, ConfigError):
        raise AssertionError(f"{type(out).__name__} escaped the loader: {out!r}") from out
    return out  # type: ignore[return-value]


@FUZZ
@given(layout=LAYOUT)
def test_generated_layouts_load_or_fail_in_one_line(layout) -> None:
    top = Path(tempfile.mkdtemp(prefix="rls-loader-fuzz-"))
    root = top / "cfg"
    sockets = build(root, layout)
    try:
        out = load_in_thread(root)
        if isinstance(out, ConfigError):
            line = str(out)
            assert "\n" not in line and len(line) < 2000, line
            assert out.file.startswith(str(root)), line
    finally:
        for sock in sockets:
            sock.close()
        shutil.rmtree(top, ignore_errors=True)


async def swap_and_reload(root: Path, layout: list[tuple[str, str, str]]) -> None:
    root.mkdir(parents=True)
    (root / "known.yaml").write_text(GOOD)
    holder = ConfigHolder([str(root)], Metrics(), budget=lambda: LoadBudget(**BUDGET))
    assert await holder.reload_async()
    before = holder.current()
    limiter = RateLimiter(holder.current, MemoryBackend(sweep_interval=0), Settings(), Metrics())
    for child in list(root.iterdir()):
        child.unlink()
    sockets = build(root, layout)
    try:
        loaded = await holder.reload_async()
    finally:
        for sock in sockets:
            sock.close()
    after = holder.current()
    assert after is not None
    if not loaded:
        assert after is before and holder.last_error and "\n" not in holder.last_error
        decision = await limiter.should_rate_limit(
            "known", [DescriptorIn((("k", "v"),), None, False, None)])
        assert decision.overall == OK and decision.statuses[0].remaining == 4


@FUZZ
@given(layout=LAYOUT)
def test_previous_config_keeps_answering_after_a_generated_reload(layout) -> None:
    top = Path(tempfile.mkdtemp(prefix="rls-reload-fuzz-"))
    try:
        asyncio.run(asyncio.wait_for(swap_and_reload(top / "cfg", layout), HANG))
    finally:
        shutil.rmtree(top, ignore_errors=True)
