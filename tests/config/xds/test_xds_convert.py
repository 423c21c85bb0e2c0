"""Resources become exactly the file loader's documents (every field of the reference's
RateLimitConfig), and the client's settings read the reference's forms."""

from __future__ import annotations

import gc
import random

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.config.xds.convert import build_config, resource_doc
from rls.config.xds.options import Backoff
from rls.core.limits import Unit
from rls.settings.forms import parse_duration, parse_pairs

from .ads_server import domain, limit, pack, pb


def full_resource() -> object:
    child = pb.RateLimitDescriptor(
        key="path", value="/a",
        rate_limit=pb.RateLimitPolicy(unit=pb.WEEK, requests_per_unit=7, name="weekly",
                                      replaces=[pb.RateLimitReplace(name="daily")]),
    )
    top = pb.RateLimitDescriptor(
        key="user", rate_limit=pb.RateLimitPolicy(unit=pb.DAY, requests_per_unit=3,
                                                  name="daily"),
        descriptors=[child], shadow_mode=True, detailed_metric=True, quota_mode=True,
    )
    top.metadata.update({"tier": "gold", "weight": 2})
    free = pb.RateLimitDescriptor(key="free", rate_limit=pb.RateLimitPolicy(unlimited=True))
    return pb.RateLimitConfig(name="res", domain="dom", descriptors=[top, free])


YAML_TWIN = """
domain: dom
descriptors:
  - key: user
    shadow_mode: true
    detailed_metric: true
    quota_mode: true
    metadata: {tier: gold, weight: 2.0}
    rate_limit: {unit: DAY, requests_per_unit: 3, name: daily}
    descriptors:
      - key: path
        value: /a
        rate_limit:
          unit: WEEK
          requests_per_unit: 7
          name: weekly
          replaces: [{name: daily}]
  - key: free
    rate_limit: {unlimited: true}
"""


def summary(config: object) -> list[tuple[object, ...]]:
    return [
        (lim.full_key, lim.unit, lim.requests_per_unit, lim.unlimited, lim.name,
         sorted(lim.replaces), lim.shadow_mode, lim.quota_mode)
        for lim in config.all_limits()  # type: ignore[attr-defined]
    ]


def test_every_field_converts_to_what_the_same_yaml_file_loads() -> None:
    from_xds = build_config([pack(full_resource())])
    from_file = load_files([("dom.yaml", YAML_TWIN)])
    assert summary(from_xds) == summary(from_file)
    assert summary(from_xds)[1][1] is Unit.WEEK
    user = from_xds.domains["dom"].root.by_key["user"][""]
    assert dict(user.metadata or {}) == {"tier": "gold", "weight": 2.0}
    assert user.detailed_metric and from_xds.files == ("res",)


def test_a_descriptor_without_rate_limit_has_no_limit_and_no_metadata() -> None:
    doc = resource_doc(pb.RateLimitConfig(name="n", domain="d",
                                          descriptors=[pb.RateLimitDescriptor(key="k")]))
    assert doc == {"domain": "d", "descriptors": [
        {"key": "k", "value": "", "shadow_mode": False, "detailed_metric": False,
         "quota_mode": False}]}


def test_resource_names_must_be_unique_and_an_empty_domain_is_the_file_error() -> None:
    with pytest.raises(ConfigError, match="duplicate resource name 'a'"):
        build_config([pack(domain("a")), pack(domain("b", resource_name="a"))])
    with pytest.raises(ConfigError, match="config file cannot have empty domain"):
        build_config([pack(pb.RateLimitConfig(name="nameless-domain"))])


def test_merge_domain_config_lets_two_resources_share_a_domain() -> None:
    resources = [pack(domain("d", limit("a", "SECOND", 1), resource_name="r1")),
                 pack(domain("d", limit("b", "SECOND", 1), resource_name="r2"))]
    assert [lim.full_key for lim in build_config(resources, True).all_limits()] == ["d.a", "d.b"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("10s", 10.0), ("1m", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5h", 5400.0),
    ("2", 2.0), ("0", 0.0),
])
def test_durations_take_go_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "10x", "1m 30s", "-"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_pairs_split_at_the_first_separator() -> None:
    assert parse_pairs("a:1,b:http://x:80, ,c:") == {"a": "1", "b": "http://x:80", "c": ""}
    assert parse_pairs("k1:v1,k2=v2", "=:") == {"k1": "v1", "k2": "v2"}
    with pytest.raises(ValueError, match="entry 'nokey' is not key:value"):
        parse_pairs("a:1,nokey")


def test_backoff_doubles_from_initial_up_to_max_within_the_random_factor() -> None:
    plain = Backoff(10, 60, 0.5, jitter=False)
    assert [plain.next() for _ in range(5)] == [10, 20, 40, 60, 60]
    plain.reset()
    assert plain.next() == 10
    jittered = Backoff(10, 60, 0.5, jitter=True, rng=random.Random(1))
    delays = [jittered.next() for _ in range(50)]
    assert 5 <= min(delays) and max(delays) <= 60 and len(set(delays)) > 10


def test_building_a_set_leaves_no_cyclic_garbage_behind() -> None:
    """The client freezes each build out of the collector's reach: garbage cycles left by
    building would be frozen, i.e. kept for ever (a recursive closure per domain once was)."""
    resources = [pack(domain(f"d{i}", limit("k", "SECOND", 1))) for i in range(200)]
    gc.collect()
    gc.disable()
    try:
        config = build_config(resources)
        del config
        assert gc.collect() == 0
    finally:
        gc.enable()
