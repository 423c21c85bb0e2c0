"""Hot reload: poll the config paths and swap in a new config when anything changed.

Polling (default every second) sees every kind of change the same way: edits, added and
removed files, and Kubernetes ConfigMap updates, which swap a `..data` symlink rather than
touch the visible files (the fingerprint follows symlinks to their targets). A failed load
keeps the previous config, logs `file: message (at file:line, node …); keeping previous
config` and counts it. Without `allow_empty`, a load with zero domains is such an error too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from rls.config.errors import ConfigError
from rls.config.loader import load_paths, yaml_files_under
from rls.config.model import RateLimitConfig
from rls.metrics import Metrics

log = logging.getLogger("rls.config")

Fingerprint = tuple[tuple[str, str, int, int, int], ...]


def fingerprint(paths: list[str]) -> Fingerprint:
    """What the files look like on disk (stat only: this runs every reload interval)."""
    items = []
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += yaml_files_under(path)
        else:
            files.append(path)
    for file in files:
        try:
            st = os.stat(file)
            items.append((file, os.path.realpath(file), st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            items.append((file, "", 0, 0, 0))
    return tuple(items)


class ConfigHolder:
    """Owns the current config; readers call `current()` on every request (one attribute read)."""

    def __init__(
        self,
        paths: list[str],
        metrics: Metrics,
        merge_domains: bool = False,
        on_change: Callable[[RateLimitConfig], None] | None = None,
        *,
        strict: bool = False,
        allow_empty: bool = True,
    ) -> None:
        self.paths = paths
        self.strict = strict  # config warnings fail the load
        self.allow_empty = allow_empty  # False: a load with zero domains is an error
        self.metrics = metrics
        self.merge_domains = merge_domains
        self.on_change = on_change
        self.config: RateLimitConfig | None = None
        self.last_error: str | None = None
        self._fingerprint: Fingerprint = ()
        self._error_files: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def current(self) -> RateLimitConfig | None:
        return self.config

    def reload(self) -> bool:
        """Load all paths; on success swap and return True, else keep the old config."""
        fp = fingerprint(self.paths)
        self._fingerprint = fp
        try:
            config = load_paths(self.paths, self.merge_domains)
            for warning in config.warnings:
                log.warning("%s", warning)
            if self.strict and config.warnings:
                raise config.warnings[0].as_error()
            if not config.domains and not self.allow_empty:
                raise ConfigError(
                    ", ".join(self.paths) or "(no --config)",
                    "no domain loaded (0 descriptor files); "
                    "--allow-empty-config permits an empty config",
                )
        except ConfigError as exc:
            self.last_error = str(exc)
            self.metrics.config_loads.labels("error").inc()
            self.metrics.config_error.labels(exc.file).set(1)
            self._error_files.add(exc.file)
            keeping = "; keeping previous config" if self.config is not None else ""
            log.error("error loading new configuration: %s%s", exc.detail(), keeping)
            return False
        self.config = config
        for file in self._error_files:  # set to 0, not cleared: works in multiprocess mode too
            self.metrics.config_error.labels(file).set(0)
        self._error_files.clear()
        self.last_error = None
        self.metrics.config_loads.labels("success").inc()
        log.info(
            "config loaded: %d file(s), domains: %s",
            len(config.files),
            ", ".join(sorted(config.domains)) or "(none)",
        )
        if self.on_change is not None:
            self.on_change(config)
        return True

    def changed(self) -> bool:
        return fingerprint(self.paths) != self._fingerprint

    async def watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                if self.changed():
                    # Name what changed (edited, added or removed files) before reloading.
                    now = set(fingerprint(self.paths))
                    changed = sorted({item[0] for item in now ^ set(self._fingerprint)})
                    log.info("config change detected: %s", ", ".join(changed) or "(unknown)")
                    self.reload()
            except Exception:  # a reload bug must never stop reloading for good
                log.exception("config reload failed unexpectedly; keeping the old config")
                self.metrics.config_loads.labels("error").inc()

    def start(self, interval: float) -> None:
        if self._task is None and interval > 0:
            self._task = asyncio.get_running_loop().create_task(self.watch(interval))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
