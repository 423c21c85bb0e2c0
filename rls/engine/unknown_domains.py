"""Calls for a domain no config file defines: answered OK (as the reference does), not silently.

Envoy's `domain` must equal a file's `domain:`; a typo on either side allows every request. So
each unknown domain is logged with its name (once per domain per minute) and counted in
`rls_domain_not_found_total{domain}`. The name comes from the caller, so the label is bounded:
the name itself when it is short and printable, for at most MAX_NAMED distinct names, then
`_other`; the log memory is bounded by the same set of labels.

Only the limiter's unknown-domain branch calls this: a call for a known domain pays nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger("rls.limiter")

MAX_NAME_CHARS = 64  # longer names are counted under OTHER
MAX_NAMED = 100  # distinct names with a series of their own; later ones go to OTHER
LOG_EVERY_S = 60.0  # one line per label per minute
OTHER = "_other"
SHOWN_KNOWN = 5  # configured domains named in the log line


def domain_label(name: str, named: int) -> str:
    """The label a name without a series yet is counted under, `named` names having one."""
    if named >= MAX_NAMED or len(name) > MAX_NAME_CHARS or not name.isprintable():
        return OTHER
    return name


class UnknownDomains:
    """Counts and logs calls for unknown domains, bounded in labels, memory and log lines."""

    def __init__(self, counter: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._counter = counter  # rls_domain_not_found, labelled by domain
        self._clock = clock
        self._children: dict[str, Any] = {}  # label -> counter child (at most MAX_NAMED + 1)
        self._named = 0  # labels that are a domain's name (OTHER is not one)
        self._logged: dict[str, float] = {}  # label -> when it was last logged

    def report(self, domain: str, descriptors: int, known: Collection[str] = ()) -> None:
        """One call for `domain` (with `descriptors` descriptors) matched no configured domain."""
        child = self._children.get(domain)
        label = domain
        if child is None:
            label = domain_label(domain, self._named)
            child = self._children.get(label)
            if child is None:
                child = self._children[label] = self._counter.labels(label)
                self._named += label != OTHER
        child.inc(descriptors)
        now = self._clock()
        last = self._logged.get(label)
        if last is not None and now - last < LOG_EVERY_S:
            return
        self._logged[label] = now
        shown = sorted(known)[:SHOWN_KNOWN]
        more = ", …" if len(known) > SHOWN_KNOWN else ""
        log.warning(
            "domain %r matches no config file's domain: answered OK with no limit "
            "(configured domains: %s%s; counted in rls_domain_not_found_total{domain=\"%s\"}; "
            "logged once a minute per domain)",
            domain[:200], ", ".join(shown) or "none", more, label,
        )
