"""Find descriptor files, parse them, and build one immutable RateLimitConfig.

A load is all-or-nothing: the first error aborts it and the caller keeps the previous config.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rls.config.errors import ConfigError
from rls.config.model import Domain, Level, RateLimitConfig
from rls.config.parser import DomainParser, check_keys
from rls.config.usage_stats import parse_usage_stats
from rls.config.yaml_source import as_str, parse_yaml

CONFIG_SUFFIXES = (".yaml", ".yml")


def yaml_files_under(directory: str) -> list[str]:
    """`*.yaml` / `*.yml` below a directory, sorted, hidden entries skipped.

    Hidden entries are skipped so that Kubernetes ConfigMap mounts (`..data`, `..2024_…`) are
    read once, through the visible symlinks, instead of twice.
    """
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name.endswith(CONFIG_SUFFIXES):
                found.append(os.path.join(root, name))
    return found


def discover(paths: Iterable[str]) -> list[str]:
    """Descriptor files behind `paths`: files as given, directories walked.

    Response-cache rule files found in a directory are left to `--cache-config` (a file named
    explicitly is always loaded as a descriptor file).
    """
    from rls.cache.config import is_cache_file  # rls.cache.config imports rls.config

    found: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += [f for f in yaml_files_under(raw) if not is_cache_file(f)]
        elif path.exists():
            found.append(str(path))
        else:
            raise ConfigError(str(path), "no such file or directory")
    return found


def load_files(
    files: Iterable[tuple[str, str]], merge_domains: bool = False
) -> RateLimitConfig:
    """Build a config from (file name, text) pairs; raises ConfigError naming the bad file."""
    config = RateLimitConfig()
    for file, text in files:
        try:
            _load_file(config, file, text, merge_domains)
        except RecursionError:
            # Deep or self-referencing (YAML anchor) descriptor trees.
            raise ConfigError(
                file, "config error, nesting too deep (or a YAML anchor that contains itself)"
            ) from None
    return config


MAX_DEPTH = 64  # descriptor levels; deeper trees are rejected before recursion gets near limits


def _load_file(config: RateLimitConfig, file: str, text: str, merge_domains: bool) -> None:
    doc = parse_yaml(file, text)
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(file, "error loading config file: yaml: document must be a map")
    doc = doc or {}
    _check_depth(file, doc.get("descriptors"), 1)
    check_keys(file, doc, config.warnings)
    domain_name = as_str(file, doc.get("domain"), "domain")
    if not domain_name:
        raise ConfigError(
            file,
            "config file cannot have empty domain",
            line=1,
            hint="the file is empty" if not doc else "add `domain: <name>` at the top",
        )
    domain = config.domains.get(domain_name)
    if domain is None:
        domain = Domain(name=domain_name, root=Level())
        config.domains[domain_name] = domain
    elif not merge_domains:
        raise ConfigError(file, f"duplicate domain '{domain_name}' in config file")
    domain.files.append(file)
    mode = as_str(file, doc.get("failure_mode"), "failure_mode")
    if mode:
        if mode not in ("allow", "deny"):
            raise ConfigError(file, f"failure_mode must be 'allow' or 'deny', not '{mode}'")
        domain.failure_mode = mode
    usage = parse_usage_stats(file, doc.get("usage_stats"))
    if usage is not None:
        domain.usage = usage
    DomainParser(file, domain_name, config.warnings).add_descriptors(
        domain.root, doc.get("descriptors"), domain_name
    )
    config.files.append(file)


def _check_depth(file: str, items: object, depth: int) -> None:
    """Reject descriptor trees deeper than MAX_DEPTH (and self-referencing ones via anchors)."""
    if not isinstance(items, list):
        return
    if depth > MAX_DEPTH:
        raise ConfigError(file, f"config error, descriptors nested deeper than {MAX_DEPTH}")
    for item in items:
        if isinstance(item, dict) and item.get("descriptors") is not items:
            _check_depth(file, item.get("descriptors"), depth + 1)


def read_text(file: str) -> str:
    try:
        with open(file, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(file, f"error loading config file: not UTF-8: {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(file, f"error loading config file: {exc.strerror}") from None


def load_paths(paths: Iterable[str], merge_domains: bool = False) -> RateLimitConfig:
    return load_files(((f, read_text(f)) for f in discover(paths)), merge_domains)
