"""Find descriptor files, parse them, and build one immutable RateLimitConfig.

A load is all-or-nothing: the first error aborts it and the caller keeps the previous config
(the reference does the same); at start-up `rls serve` exits 1 with that error.

Everything here may be handed a hostile directory, so it is bounded (LoadBudget;
docs/reliability.md, "Hostile config directories"):
only regular files are opened (FIFOs, sockets and devices are skipped with a warning, never
opened: opening a FIFO blocks until a writer comes), symlink loops and directory links back to
a directory already walked are skipped (no endless walk, no file loaded twice), a file over
the size budget is rejected unread, and YAML is parsed with a node, depth and time budget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rls.config.errors import ConfigError, ConfigWarning, Problems
from rls.config.limit_parser import LIMIT_KEYS, SPEC_FIELDS, stray_limit_fields
from rls.config.model import Domain, Level, Node, RateLimitConfig
from rls.config.parser import DomainParser, check_keys
from rls.config.usage_stats import parse_usage_stats
from rls.config.yaml_source import YamlBudget, as_str, line_of, parse_yaml
from rls.core.keys import key_hash_problem
from rls.settings.model import FAILURE_MODES

CONFIG_SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 1 << 20

log = logging.getLogger("rls.config")

Warn = Callable[[str], None]


def _no_warning(_message: str) -> None:
    """For callers that only look (the change detector): warnings are logged at load time."""


@dataclass(frozen=True, slots=True)
class LoadBudget:
    """Limits of one load (documented in docs/reliability.md, "Hostile config directories").

    Defaults fit configs far larger than any seen in practice (a 1 MiB file holds ~20,000
    descriptors) while bounding what a broken or malicious file can cost.
    """

    max_file_bytes: int = MAX_FILE_BYTES
    max_total_bytes: int = 64 << 20
    max_files: int = 50_000
    max_nodes: int = 1_000_000  # per file, YAML aliases expanded
    max_depth: int = 200  # YAML nesting per file
    file_seconds: float = 10.0  # parsing one file
    load_seconds: float = 60.0  # the whole load
    started: float = field(default_factory=time.monotonic)

    def for_file(self) -> YamlBudget:
        now = time.monotonic()
        deadline = min(now + self.file_seconds, self.started + self.load_seconds)
        return YamlBudget(self.max_nodes, self.max_depth, deadline)

    def check_time(self, file: str) -> None:
        if time.monotonic() > self.started + self.load_seconds:
            raise ConfigError(
                file, f"config load took longer than {self.load_seconds:g} s; load abandoned"
            )


SKIPPED_SUFFIX = (
    "skipped: its name does not end in .yaml or .yml (envoyproxy/ratelimit reads every file "
    "of its directory: rename it, or pass --config-all-files)"
)


def yaml_files_under(
    directory: str, warn: Warn = log.warning, every_file: bool = False
) -> list[str]:
    """`*.yaml` / `*.yml` regular files below a directory, sorted, hidden entries skipped;
    with `every_file`, every regular file, as the reference's runtime loader reads them.

    Without `every_file` another regular file is skipped with a warning naming it: a ConfigMap
    key without an extension would otherwise leave its domain unknown (every call OK) without
    a word. Hidden entries are skipped so that Kubernetes ConfigMap mounts (`..data`,
    `..2024_…`) are read once, through the visible symlinks, instead of twice. Symlinks are
    followed, but a directory already walked (a link back to a parent) and a file already found
    (two links to one file) are skipped with a warning, as are entries that are not regular
    files and links that loop or dangle. The order is os.walk's top-down order: a directory's
    files, then its subdirectories by name.
    """
    found: list[str] = []
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: dict[tuple[int, int], str] = {}
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            st = os.stat(current)
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:
                warn(f"{current}: skipped: directory already read (a link back to a parent?)")
                continue
            seen_dirs.add(key)
            with os.scandir(current) as it:
                names = sorted(entry.name for entry in it if not entry.name.startswith("."))
        except OSError as exc:
            warn(f"{current}: skipped: {exc.strerror}")
            continue
        subdirs = []
        for name in names:
            path = os.path.join(current, name)
            try:
                st = os.stat(path)  # follows symlinks; ELOOP for links that loop
            except OSError as exc:
                if every_file or name.endswith(CONFIG_SUFFIXES) or os.path.islink(path):
                    warn(f"{path}: skipped: {exc.strerror}")
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(path)
            elif not every_file and not name.endswith(CONFIG_SUFFIXES):
                if stat.S_ISREG(st.st_mode):
                    warn(f"{path}: {SKIPPED_SUFFIX}")
            else:
                if not stat.S_ISREG(st.st_mode):
                    warn(f"{path}: skipped: not a regular file ({_kind(st.st_mode)})")
                    continue
                first = seen_files.setdefault((st.st_dev, st.st_ino), path)
                if first != path:
                    warn(f"{path}: skipped: same file as {first}")
                    continue
                found.append(path)
        stack.extend(reversed(subdirs))
    return found


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _sources(paths: Iterable[str], warn: Warn, every_file: bool) -> list[tuple[str, bool]]:
    """(file, found in a directory) for every path: files as given, directories walked."""
    out: list[tuple[str, bool]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += [(f, True) for f in yaml_files_under(raw, warn, every_file)]
        elif path.exists():
            out.append((str(path), False))
        else:
            raise ConfigError(str(path), missing_reason(raw))
    return out


def missing_reason(path: str) -> str:
    """Why a `--config` path cannot be opened: a link that loops or points nowhere says so and
    where it points, since the path itself is there (`ls` shows it)."""
    if not os.path.islink(path):
        return "no such file or directory"
    try:
        os.stat(path)
    except OSError as exc:
        return f"a symbolic link to {os.readlink(path)}: {(exc.strerror or 'unreadable').lower()}"
    return "no such file or directory"


def config_files(paths: Iterable[str], every_file: bool = False) -> list[str]:
    """Every file a load of `paths` would look at (cache rule files included), for change
    detection; never opens a file, never warns."""
    out = []
    for raw in paths:
        if os.path.isdir(raw):
            out += yaml_files_under(raw, _no_warning, every_file)
        else:
            out.append(raw)
    return out


def is_cache_doc(doc: Any) -> bool:
    """Whether a parsed document is a response-cache rules file rather than descriptors.

    Same rule as rls.response_cache.config.is_cache_file (a mapping with `rules` and no
    `domain`, or a list whose first item is a mapping with `api`), applied to the document the
    loader has already read within its budgets instead of opening the file a second time.
    """
    if isinstance(doc, dict):
        return "rules" in doc and "domain" not in doc
    return isinstance(doc, list) and bool(doc) and isinstance(doc[0], dict) and "api" in doc[0]


def discover(paths: Iterable[str], every_file: bool = False) -> list[str]:
    """Descriptor files behind `paths`: files as given, directories walked.

    Response-cache rule files found in a directory are left to `--cache-config` (a file named
    explicitly is always loaded as a descriptor file). A file that cannot be read or parsed is
    kept (loading it reports the error).
    """
    found: list[str] = []
    for file, in_directory in _sources(paths, log.warning, every_file):
        if in_directory:
            try:
                if is_cache_doc(parse_yaml(file, read_text(file))):
                    continue
            except ConfigError:
                pass
        found.append(file)
    return found


def load_files(
    files: Iterable[tuple[str, str]], merge_domains: bool = False
) -> RateLimitConfig:
    """Build a config from (file name, text) pairs; raises ConfigError with every problem of
    every bad file (each file is checked, whatever the files before it held)."""
    draft = _ConfigDraft(merge_domains)
    found = Problems()
    for file, text in files:
        found.check(None, _add_file, draft, file, lambda f=file, t=text: parse_yaml(f, t))
    found.raise_if_any()
    return draft.build()


def _add_file(draft: _ConfigDraft, file: str, read: Callable[[], Any]) -> None:
    """Parse (`read`) and add one file; RecursionError (deep or self-referencing descriptor
    trees, through YAML anchors) becomes the file's ConfigError."""
    try:
        draft.add(file, read())
    except RecursionError:
        raise ConfigError(file, _TOO_DEEP) from None


def load_documents(
    docs: Iterable[tuple[str, Any]], merge_domains: bool = False,
    budget: LoadBudget | None = None,
) -> RateLimitConfig:
    """Build a config from (name, parsed document) pairs that did not come from YAML text
    (xDS resources, rls.config.xds.convert): the same checks as files, within `budget`'s
    time; ConfigError naming the bad document."""
    budget = budget or LoadBudget()
    draft = _ConfigDraft(merge_domains)
    for name, doc in docs:
        budget.check_time(name)
        try:
            draft.add(name, doc)
        except RecursionError:
            raise ConfigError(name, _TOO_DEEP) from None
    return draft.build()


_TOO_DEEP = "config error, nesting too deep (or a YAML anchor that contains itself)"


MAX_DEPTH = 64  # descriptor levels; deeper trees are rejected before recursion gets near limits


@dataclass
class _DomainDraft:
    """One domain while its files load (several with --merge-domains); frozen by build()."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    failure_mode: str | None = None
    usage: Any = None
    key_hash: str = ""

    def build(self) -> Domain:
        return Domain(
            self.name,
            Level.of(self.nodes),
            tuple(self.files),
            self.failure_mode,
            self.usage,
            self.key_hash,
        )


NO_DOMAIN = "<no domain>"  # the stand-in name a file without a domain is checked under


class _ConfigDraft:
    """What a load accumulates, file by file; `build()` makes the immutable config."""

    def __init__(self, merge_domains: bool) -> None:
        self.merge_domains = merge_domains
        self.domains: dict[str, _DomainDraft] = {}
        self.files: list[str] = []
        self.warnings: list[ConfigWarning] = []
        self.cache_files: list[str] = []

    def add(self, file: str, doc: Any) -> None:
        """One file's document, or a ConfigError with every independent problem of it.

        The file's domain is built on a copy and committed only when the file is clean, so a
        bad file leaves nothing behind for the files after it to trip over."""
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError(file, "error loading config file: yaml: document must be a map")
        doc = doc or {}
        _check_depth(file, doc.get("descriptors"), 1)
        found = Problems()
        check_keys(file, doc, self.warnings, found)
        self.warnings += stray_limit_fields(
            file, doc, "", LIMIT_KEYS + SPEC_FIELDS,
            "at the top of the file is ignored: limits belong to a descriptor "
            "(under descriptors:)",
        )
        domain_name = found.check("", as_str, file, doc.get("domain"), "domain")
        if not domain_name:
            found.add(ConfigError(
                file,
                "config file cannot have empty domain",
                line=1,
                hint="the file is empty" if not doc else "add `domain: <name>` at the top",
            ))
            if not doc:
                found.raise_if_any()
        # Without a name the rest is still checked, under a stand-in one, so that a typo in
        # `domain:` does not hide the descriptors' problems; it is never committed or merged.
        domain = (self._domain_for(file, domain_name, found) if domain_name
                  else _DomainDraft(NO_DOMAIN, files=[file]))
        domain_name = domain.name
        mode = found.check("", as_str, file, doc.get("failure_mode"), "failure_mode")
        if mode:
            if mode in FAILURE_MODES:
                domain.failure_mode = mode
            else:
                found.add(ConfigError(
                    file, f"failure_mode must be 'allow', 'deny' or 'error', not '{mode}'",
                    line=line_of(doc, "failure_mode"), node="failure_mode",
                ))
        found.check(None, _domain_key_hash, file, doc, domain)
        usage = found.check(None, parse_usage_stats, file, doc.get("usage_stats"))
        if usage is not None:
            domain.usage = usage
        parser = DomainParser(file, domain_name, self.warnings, found)
        found.check(None, parser.add_descriptors, domain.nodes, doc.get("descriptors"),
                    domain_name)
        found.raise_if_any()
        self.domains[domain_name] = domain
        self.files.append(file)

    def _domain_for(self, file: str, name: str, found: Problems) -> _DomainDraft:
        """A working copy of the domain `file` adds to (a new one unless merging)."""
        domain = self.domains.get(name)
        if domain is not None and not self.merge_domains:
            found.add(ConfigError(file, f"duplicate domain '{name}' in config file"))
        if domain is None or not self.merge_domains:
            return _DomainDraft(name, files=[file])
        return dataclasses.replace(domain, nodes=list(domain.nodes), files=[*domain.files, file])

    def build(self) -> RateLimitConfig:
        return RateLimitConfig(
            {name: d.build() for name, d in self.domains.items()},
            tuple(self.files),
            tuple(self.warnings),
            tuple(self.cache_files),
        )


def _domain_key_hash(file: str, doc: dict[str, Any], domain: _DomainDraft) -> None:
    """Top-level `key_hash: md5|xxh3` (a domain setting: it applies to every node of the
    domain). Files merged into one domain that set it must agree: one domain has one key
    layout."""
    if "key_hash" not in doc:
        return
    line = line_of(doc, "key_hash")
    try:
        name = as_str(file, doc.get("key_hash"), "key_hash")
    except ConfigError as exc:
        raise exc.locate(line, "key_hash") from None
    problem = key_hash_problem(name) if name else None
    if problem is not None:
        raise ConfigError(file, problem, line=line, node="key_hash")
    if domain.key_hash and name != domain.key_hash:
        raise ConfigError(
            file,
            f"key_hash '{name}' differs from '{domain.key_hash}' set for domain "
            f"'{domain.name}' by an earlier file",
            line=line,
            node="key_hash",
        )
    domain.key_hash = name


def _check_depth(file: str, items: object, depth: int) -> None:
    """Reject descriptor trees deeper than MAX_DEPTH (and self-referencing ones via anchors)."""
    if not isinstance(items, list):
        return
    if depth > MAX_DEPTH:
        raise ConfigError(file, f"config error, descriptors nested deeper than {MAX_DEPTH}")
    for item in items:
        if isinstance(item, dict) and item.get("descriptors") is not items:
            _check_depth(file, item.get("descriptors"), depth + 1)


def read_text(file: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A regular file's text, at most `max_bytes`; ConfigError otherwise.

    Opened non-blocking and checked with fstat before reading, so a FIFO (or a file swapped
    for one after the directory was walked) is refused instead of blocking forever.
    """
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(file, f"error loading config file: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                file, f"error loading config file: {_kind(st.st_mode)}, not a regular file"
            )
        if st.st_size > max_bytes:
            raise ConfigError(file, _too_big(st.st_size, max_bytes))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(file, f"error loading config file: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew between fstat and read
        raise ConfigError(file, _too_big(len(data), max_bytes))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(file, f"error loading config file: not UTF-8: {exc.reason}") from None


def _too_big(size: int, limit: int) -> str:
    return f"error loading config file: {size} bytes, over the {limit}-byte limit per file"


def load_paths(
    paths: Iterable[str], merge_domains: bool = False, budget: LoadBudget | None = None,
    *, every_file: bool = False,
) -> RateLimitConfig:
    """Load every descriptor file behind `paths` within `budget` (in directories, `*.yaml` /
    `*.yml`, or with `every_file` every file); ConfigError with every problem of every bad
    file (the whole load is rejected); a budget overrun ends it."""
    budget = budget or LoadBudget()
    sources = _sources(paths, log.warning, every_file)
    if len(sources) > budget.max_files:
        raise ConfigError(
            str(next(iter(paths), "")), f"more than {budget.max_files} config files"
        )
    draft = _ConfigDraft(merge_domains)
    found = Problems()
    total = 0
    for file, in_directory in sources:
        budget.check_time(file)
        text = found.check(None, read_text, file, budget.max_file_bytes)
        if text is None:
            continue
        total += len(text)
        if total > budget.max_total_bytes:
            raise ConfigError(
                file, f"config files total over the {budget.max_total_bytes}-byte limit"
            )
        doc = found.check(_UNREAD, parse_yaml, file, text, budget.for_file())
        if doc is _UNREAD:
            continue
        if in_directory and is_cache_doc(doc):
            draft.cache_files.append(file)  # cache rules: loaded by --cache-config, not here
            continue
        found.check(None, _add_file, draft, file, lambda d=doc: d)
    found.raise_if_any()
    return draft.build()


_UNREAD = object()  # a file whose YAML did not parse (its error is kept)
