"""Issue 33: the quota demo's banner says what `used` of /counters means there.

In quota mode Envoy's grants are charged when rls hands them out, so right after a request or
two `used` is well above the requests sent, and a client that sent nothing this window may
show the whole limit: the banner must not promise a count of requests.
"""

from __future__ import annotations

from pathlib import Path

from rls.demo.banner import quota_banner
from rls.demo.descriptors import QUOTA_LIMIT
from rls.demo.processes import Demo


def test_the_quota_banner_says_used_counts_grants_not_requests() -> None:
    demo = Demo(listener=1, envoy_admin=2, grpc=3, http=4, backends=[5], keys={},
                workdir=Path("/tmp/demo"))
    text = quota_banner(demo)
    comment = text.split("/counters", 1)[0].rsplit("\n  # the limit's counter", 1)[1]
    said = " ".join(line.strip().lstrip("# ") for line in comment.splitlines())
    assert "`used` is what Envoy was granted, charged when rls hands it out" in said, said
    assert "not the requests sent" in said and f"up to the whole {QUOTA_LIMIT}" in said, said


def test_admin_md_says_what_used_means_for_a_quota_mode_limit() -> None:
    """The reference for /counters says it too, not only the demo's banner."""
    root = Path(__file__).resolve().parents[2]
    admin = " ".join((root / "docs" / "admin.md").read_text().split())
    section = admin[admin.index("## POST /counters"):]
    section = section[:section.index("```")]
    assert "for a `quota_mode` limit, what Envoys were granted" in section, section
    assert "not the requests sent" in section, section
