"""Bucket ids matched against descriptors: the rules documented in rls/quota/match.py."""

from __future__ import annotations

from rls.config.loader import load_files
from rls.config.model import Domain
from rls.engine.checks import match_targets
from rls.quota.match import order_bucket

CONFIG = """
domain: d
descriptors:
  - key: x-client-id
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /slow
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: x-client-id
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tenant
    value: "acme-*"
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: name
    value: shared
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: container
    value: only
    descriptors:
      - key: leaf
        rate_limit: {unit: second, requests_per_unit: 7}
"""


def domain() -> Domain:
    return load_files([("inline.yaml", CONFIG)]).domains["d"]


def test_top_level_key_matches_the_bucket_entry_of_that_key_with_default_value() -> None:
    assert order_bucket(domain(), {"x-client-id": "alice"}) == (("x-client-id", "alice"),)


def test_exact_value_wins_over_the_key_only_default() -> None:
    dom = domain()
    entries = order_bucket(dom, {"x-client-id": "vip"})
    ((limit, *_),) = match_targets(dom, "d", entries, "rl:")
    assert limit.requests_per_unit == 1000


def test_wildcard_value_matches() -> None:
    assert order_bucket(domain(), {"tenant": "acme-7"}) == (("tenant", "acme-7"),)
    assert order_bucket(domain(), {"tenant": "other"}) is None


def test_extra_entries_such_as_envoys_static_name_are_ignored() -> None:
    entries = order_bucket(domain(), {"name": "per-client", "x-client-id": "alice"})
    assert entries == (("x-client-id", "alice"),)


def test_a_descriptor_may_use_the_name_entry_itself() -> None:
    assert order_bucket(domain(), {"name": "shared"}) == (("name", "shared"),)


def test_nested_descriptor_takes_entries_in_tree_order_and_the_deepest_match_wins() -> None:
    dom = domain()
    entries = order_bucket(dom, {"path": "/slow", "x-client-id": "alice"})
    assert entries == (("x-client-id", "alice"), ("path", "/slow"))
    ((limit, *_),) = match_targets(dom, "d", entries, "rl:")
    assert limit.requests_per_unit == 2


def test_nested_entry_without_its_parent_does_not_match() -> None:
    assert order_bucket(domain(), {"path": "/slow"}) is None
    assert order_bucket(domain(), {"leaf": "x"}) is None


def test_container_without_limit_matches_only_through_its_children() -> None:
    assert order_bucket(domain(), {"container": "only"}) is None
    assert order_bucket(domain(), {"container": "only", "leaf": "x"}) == (
        ("container", "only"), ("leaf", "x"),
    )


def test_bucket_and_should_rate_limit_descriptor_share_one_counter_key() -> None:
    dom = domain()
    from_bucket = match_targets(dom, "d", order_bucket(dom, {"x-client-id": "a"}), "rl:")
    from_descriptor = match_targets(dom, "d", (("x-client-id", "a"),), "rl:")
    assert [t[1] for t in from_bucket] == [t[1] for t in from_descriptor]


def test_empty_or_unknown_bucket_is_unmatched() -> None:
    assert order_bucket(domain(), {}) is None
    assert order_bucket(domain(), {"unknown": "x"}) is None
