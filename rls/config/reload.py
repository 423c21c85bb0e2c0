"""Hot reload: watch the config paths with inotify (watchfiles) and swap in a new config.

Nothing here reads or parses a file on the event loop: a change event wakes a thread that
compares the files' stat fingerprint and, when it moved, loads the config within the
loader's budgets (rls.config.loader.LoadBudget); the loop only swaps the result in. Watching
10,000 files therefore costs the loop nothing between changes (no per-file polling).

Kubernetes ConfigMap updates swap a `..data` symlink in the mounted directory rather than
touch the visible files; that swap is an event in the watched directory, and the fingerprint
follows symlinks to their targets. A config given as a file is watched through its parent
directory, so editors and deploys that replace the file by rename are seen too. If the
watcher cannot start (inotify limits), the same fingerprint check runs in a thread every
reload interval instead.

A failed load keeps the previous config, logs one line `file: message (at file:line, node …);
keeping previous config`, sets `rls_config_last_load_error{file}` and counts
`rls_config_loads_total{result="error"}`. Without `allow_empty`, a load with zero domains is
such an error too; with `strict`, so is a config warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import watchfiles

from rls.config.errors import ConfigError
from rls.config.loader import LoadBudget, config_files, load_paths
from rls.config.model import RateLimitConfig
from rls.event_loop import cancel_and_wait
from rls.observability.metrics import Metrics

log = logging.getLogger("rls.config")

Fingerprint = tuple[tuple[str, str, int, int, int], ...]
T = TypeVar("T")

MAX_LOG_CHARS = 400  # one short line per error, whatever a file holds
WATCH_DEBOUNCE_MS = 500  # longest a stream of changes is grouped before a reload
WATCH_STEP_MS = 50  # quiet time that ends a group of changes
WATCH_READY_MS = 250  # the watcher thread wakes this often when idle (no file is touched)


def one_line(text: str, limit: int = MAX_LOG_CHARS) -> str:
    """`text` on one line, cut to `limit` characters (errors may quote file content)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _skipped(config: RateLimitConfig) -> str:
    """`; not descriptors: …` naming the response-cache rules files a directory held (they
    are read by --cache-config, not as limits), so a file count that looks short says why."""
    if not config.cache_files:
        return ""
    names = one_line(", ".join(config.cache_files))
    return (f"; {len(config.cache_files)} response-cache rules file(s) skipped "
            f"(not descriptors; --cache-config reads them): {names}")


MAX_PROBLEMS_SHOWN = 20  # in one log line; `rls check-config` lists them all


def problems_line(error: ConfigError) -> str:
    """Every problem of a load on one line, `P1 | P2 | …` (each located, each cut to
    MAX_LOG_CHARS), at most MAX_PROBLEMS_SHOWN of them and then how many more."""
    shown = [one_line(p.located()) for p in error.problems[:MAX_PROBLEMS_SHOWN]]
    more = len(error.problems) - len(shown)
    return " | ".join(shown + [f"and {more} more"] * bool(more))


def check_config_command(
    paths: list[str], merge_domains: bool, strict: bool, every_file: bool = False
) -> str:
    """The `rls check-config` line that lists every problem of a config that would not start
    (to run again once they are fixed)."""
    flags = (["--merge-domains"] * merge_domains + ["--strict"] * strict
             + ["--config-all-files"] * every_file)
    return shlex.join(["rls", "check-config", *flags, *paths])


def fingerprint(paths: list[str], every_file: bool = False) -> Fingerprint:
    """What the files look like on disk (stat only; never opens a file)."""
    items = []
    for file in config_files(paths, every_file):
        try:
            st = os.stat(file)
            items.append((file, os.path.realpath(file), st.st_mtime_ns, st.st_size, st.st_ino))
        except (OSError, RuntimeError):  # dangling or looping link
            items.append((file, "", 0, 0, 0))
    return tuple(items)


def link_parents(path: str) -> list[str]:
    """The directory holding each symlink among `path`'s components (`path` included).

    inotify watches what a link pointed to when the watch was set: a swap of the link itself
    (a runtime root `/srv/runtime_data/current -> v42` moved to v43, the reference's
    RUNTIME_WATCH_ROOT layout) is an event only in the directory that holds the link."""
    out: list[str] = []
    current = os.path.abspath(path)
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            return out
        if os.path.islink(current):
            out.append(parent)
        current = parent


async def in_daemon_thread(fn: Callable[[], T], timeout: float) -> T:
    """Run `fn` in a daemon thread and await it for at most `timeout` seconds.

    Not asyncio.to_thread: a load that overstays its budget must neither hold the default
    executor nor keep the interpreter from exiting on SIGTERM.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="rls-config-load", daemon=True).start()
    return await asyncio.wait_for(future, timeout)


def _watch_until_stopped(
    roots: list[str], recursive: bool, stop: threading.Event, wake: Callable[[], object]
) -> str:
    """Call `wake` on every batch of changes under `roots` (watchfiles' inotify watch) until
    `stop` is set or the watcher fails; why it ended, in one line."""
    settled = False
    try:
        for changes in watchfiles.watch(
            *roots,
            watch_filter=None,
            recursive=recursive,
            debounce=WATCH_DEBOUNCE_MS,
            step=WATCH_STEP_MS,
            stop_event=stop,
            ignore_permission_denied=True,
            raise_interrupt=False,
            rust_timeout=WATCH_READY_MS,
            yield_on_timeout=True,
        ):
            # The first yield (a change, or an empty set after WATCH_READY_MS) means the
            # watches are in place: check once for changes made before that.
            if changes or not settled:
                settled = True
                wake()
    except Exception as exc:
        return one_line(str(exc)) or type(exc).__name__
    return "watcher stopped"


class ConfigHolder:
    """Owns the current config; readers call `current()` on every request (one attribute read)."""

    def __init__(
        self,
        paths: list[str],
        metrics: Metrics,
        merge_domains: bool = False,
        on_change: Callable[[RateLimitConfig], None] | None = None,
        budget: Callable[[], LoadBudget] = LoadBudget,
        *,
        strict: bool = False,
        allow_empty: bool = True,
        every_file: bool = False,
    ) -> None:
        self.paths = paths
        self.every_file = every_file  # every file of a directory, not only *.yaml / *.yml
        self.strict = strict  # config warnings fail the load
        self.allow_empty = allow_empty  # False: a load with zero domains is an error
        self.metrics = metrics
        self.merge_domains = merge_domains
        self.on_change = on_change
        self.budget = budget  # a fresh budget (its clock starts) for every load
        self.config: RateLimitConfig | None = None
        self.last_error: str | None = None
        self._fingerprint: Fingerprint = ()
        self._error_files: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def current(self) -> RateLimitConfig | None:
        return self.config

    def _load(self) -> tuple[Fingerprint, RateLimitConfig | ConfigError]:
        """Fingerprint and load; runs in a worker thread (or at start-up, before serving)."""
        fp = fingerprint(self.paths, self.every_file)
        try:
            config = load_paths(self.paths, self.merge_domains, self.budget(),
                                every_file=self.every_file)
            for warning in config.warnings:
                log.warning("%s", warning)
            if self.strict and config.warnings:
                raise ConfigError.of([warning.as_error() for warning in config.warnings])
            if not config.domains and not self.allow_empty:
                raise ConfigError(
                    ", ".join(self.paths) or "(no --config)",
                    "no domain loaded (0 descriptor files); "
                    "--allow-empty-config permits an empty config",
                )
            return fp, config
        except ConfigError as exc:
            return fp, exc
        except Exception as exc:  # a loader bug: one line, never a traceback, keep serving
            where = self.paths[0] if self.paths else "<config>"
            return fp, ConfigError(where, f"unexpected {type(exc).__name__}: {exc}")

    def _load_if_changed(self) -> tuple[Fingerprint, RateLimitConfig | ConfigError] | None:
        now = fingerprint(self.paths, self.every_file)
        if now == self._fingerprint:
            return None
        # Name what changed (edited, added or removed files) before reloading.
        changed = sorted({item[0] for item in set(now) ^ set(self._fingerprint)})
        log.info("config change detected: %s", one_line(", ".join(changed)) or "(unknown)")
        return self._load()

    def reload(self, *, log_error: bool = True) -> bool:
        """Load all paths in this thread; on success swap and return True, else keep the
        old config (used at start-up, before the loop serves anything). `log_error=False`:
        the caller reports `last_error` itself (start-up's one line)."""
        return self._apply(*self._load(), log_error=log_error)

    async def reload_async(self, only_if_changed: bool = False) -> bool:
        """Load in a daemon thread (never on the loop); swap the result in on the loop."""
        budget = self.budget()
        limit = budget.load_seconds + 5.0  # the loader stops itself at load_seconds
        work = self._load_if_changed if only_if_changed else self._load
        try:
            outcome = await in_daemon_thread(work, limit)
        except TimeoutError:
            where = self.paths[0] if self.paths else "<config>"
            error = ConfigError(where, f"config load did not finish within {limit:g} s")
            return self._apply(self._fingerprint, error)
        if outcome is None:
            return False
        return self._apply(*outcome)

    def apply(self, result: RateLimitConfig | ConfigError, label: str) -> bool:
        """Swap in a config built elsewhere (rls.config.xds), or record its error, exactly as
        a reload does; `label` stands for the file in rls_config_last_load_error (a bounded
        name: a control plane's resource names are not)."""
        return self._apply(self._fingerprint, result, label=label)

    def _apply(self, fp: Fingerprint, result: RateLimitConfig | ConfigError,
               log_error: bool = True, label: str | None = None) -> bool:
        self._fingerprint = fp
        if isinstance(result, ConfigError):
            self.last_error = problems_line(result)  # each with its location
            self.metrics.config_loads.labels("error").inc()
            self.metrics.config_error.labels(label or result.file).set(1)
            self._error_files.add(label or result.file)
            keeping = "; keeping previous config" if self.config is not None else ""
            if log_error:
                log.error("error loading new configuration: %s%s", self.last_error, keeping)
            return False
        config = result
        self.config = config
        self.clear_errors()
        self.metrics.config_loads.labels("success").inc()
        self.metrics.prepare_domains(config.domains)
        log.info(
            "config loaded: %d %s, domains: %s%s",
            len(config.files),
            "descriptor file(s)" if label is None else f"{label} resource(s)",
            one_line(", ".join(sorted(config.domains)) or "(none)"),
            _skipped(config),
        )
        if self.on_change is not None:
            self.on_change(config)
        return True

    def clear_errors(self) -> None:
        """The config in force is the latest word again (a control plane went back to the set
        it had sent before a refused one): no refusal stands."""
        for file in self._error_files:  # set to 0, not cleared: works in multiprocess mode too
            self.metrics.config_error.labels(file).set(0)
        self._error_files.clear()
        self.last_error = None

    def changed(self) -> bool:
        return fingerprint(self.paths, self.every_file) != self._fingerprint

    def _watch_roots(self) -> tuple[list[str], list[str]]:
        """(directories to watch recursively, directories to watch alone: parents of config
        files, and the directory of every symlink on the way to a config path)."""
        trees, parents = [], []
        for path in self.paths:
            if os.path.isdir(path):
                trees.append(path)
                alone = link_parents(path)
            else:
                alone = [os.path.dirname(os.path.abspath(path)), *link_parents(path)]
            parents += [p for p in alone if os.path.isdir(p) and p not in parents]
        return trees, parents

    async def _watch_events(
        self, roots: list[str], recursive: bool, wake: asyncio.Event, interval: float
    ) -> None:
        """Set `wake` on every batch of changes under `roots` (inotify through watchfiles, in a
        daemon thread: even setting up the watches walks the tree); when the watcher cannot
        run, set it every `interval` instead (the fingerprint check still runs off the loop)."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        ended: asyncio.Future[str] = loop.create_future()

        def finish(reason: str) -> None:
            if not ended.done():
                ended.set_result(reason)

        def run() -> None:
            reason = _watch_until_stopped(
                roots, recursive, stop, lambda: loop.call_soon_threadsafe(wake.set)
            )
            if not stop.is_set():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(finish, reason)

        thread = threading.Thread(target=run, name="rls-config-watch", daemon=True)
        thread.start()
        try:
            reason = await ended
            log.warning(
                "cannot watch %s (%s); checking for changes every %g s instead",
                ", ".join(roots),
                reason,
                interval,
            )
            while True:
                await asyncio.sleep(interval)
                wake.set()
        finally:
            # The watcher sees `stop` within WATCH_STEP_MS; wait for it so that it never wakes
            # up in Rust code while the interpreter is finalizing (rls is exiting).
            stop.set()
            thread.join(timeout=2 * WATCH_STEP_MS / 1000)

    async def watch(self, interval: float) -> None:
        wake = asyncio.Event()
        trees, parents = self._watch_roots()
        loop = asyncio.get_running_loop()
        watchers = [
            loop.create_task(self._watch_events(roots, recursive, wake, interval))
            for roots, recursive in ((trees, True), (parents, False))
            if roots
        ]
        try:
            while True:
                await wake.wait()
                wake.clear()
                try:
                    await self.reload_async(only_if_changed=True)
                except Exception as exc:  # a reload bug must never stop reloading for good
                    log.error("config reload failed unexpectedly: %s", one_line(repr(exc)))
                    self.metrics.config_loads.labels("error").inc()
        finally:
            for task in watchers:
                task.cancel()
            for task in watchers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def start(self, interval: float) -> None:
        if self._task is None and interval > 0:
            self._task = asyncio.get_running_loop().create_task(self.watch(interval))

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
