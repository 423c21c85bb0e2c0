"""Load-balancing variants of the gateway: generated files, and user stickiness end to end.

envoy/gateway-{round-robin,random,ring-hash,maglev}.yaml (and gateway-stream-done.yaml) are
generated from envoy/gateway.yaml by tests/e2e/gateway_variants.py; the first tests keep the
committed files equal to the generator's output. The others run a real Envoy with three
recording backends: with RING_HASH / MAGLEV and the routes' hash_policy on the Envoy-set
x-client-id, each user always lands on the same backend; ROUND_ROBIN spreads one user's
requests. Every request goes out on a new client connection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import yaml

from . import gateway_variants
from .harness import Backend, Gateway

pytestmark = pytest.mark.envoy

REQUESTS_PER_USER = 12
USERS = ("alice", "bob")

DESCRIPTORS = """\
domain: gateway
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 100}
"""


def test_variants_are_generated_from_gateway_yaml() -> None:
    rendered = gateway_variants.render()
    assert set(rendered) == {v.file for v in gateway_variants.LB_VARIANTS} | {
        gateway_variants.STREAM_DONE_FILE
    }
    stale = [name for name, text in rendered.items()
             if not (gateway_variants.ENVOY_DIR / name).is_file()
             or (gateway_variants.ENVOY_DIR / name).read_text() != text]
    assert not stale, (
        f"stale generated configs {stale}: run `python -m tests.e2e.gateway_variants`"
    )


@pytest.mark.parametrize("name", sorted(gateway_variants.render()))
def test_variant_text_edits_match_their_structural_meaning(name: str) -> None:
    # The generator edits text (to keep comments); the parsed result must be exactly the
    # base config with the intended change made on the data.
    base = yaml.safe_load(gateway_variants.BASE.read_text())
    variant = yaml.safe_load(gateway_variants.render()[name])
    assert variant == gateway_variants.expected_structure(base, name)


@pytest.mark.parametrize("variant", gateway_variants.LB_VARIANTS, ids=lambda v: v.file)
def test_lb_variant_shape(variant: gateway_variants.LbVariant) -> None:
    config = yaml.safe_load((gateway_variants.ENVOY_DIR / variant.file).read_text())
    backend = gateway_variants.cluster_of(config, "backend")
    assert backend["lb_policy"] == variant.policy
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in backend["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == list(gateway_variants.BACKEND_PORTS)
    for route in gateway_variants.routes_of(config):
        policy = route["route"].get("hash_policy")
        if variant.hashing:
            assert policy == [{"header": {"header_name": "x-client-id"}}], route["name"]
        else:
            assert policy is None, route["name"]


@pytest.fixture
def backends() -> Iterator[list[Backend]]:
    servers = [Backend().start() for _ in gateway_variants.BACKEND_PORTS]
    yield servers
    for server in servers:
        server.stop()


def served_by(gw: Gateway, prefix: str) -> dict[str, Counter[int]]:
    """client id -> Counter of backend index, for requests under `prefix`."""
    out: dict[str, Counter[int]] = {}
    for index, backend in enumerate(gw.backends):
        for seen in backend.seen():
            if seen.path.startswith(prefix):
                out.setdefault(seen.headers["x-client-id"], Counter())[index] += 1
    return out


def send(gw: Gateway, prefix: str, users: tuple[str, ...]) -> None:
    for n in range(REQUESTS_PER_USER):
        for user in users:
            resp = gw.call(f"{prefix}?n={n}", user)
            assert resp.status == 200, f"{resp}\n{gw.logs()}"
            assert "x-ratelimit-limit" in resp.headers  # rls was consulted on this route


@pytest.mark.parametrize("config", ["gateway-ring-hash.yaml", "gateway-maglev.yaml"])
def test_consistent_hash_keeps_each_user_on_one_backend(
    gateway_factory: Callable[..., Gateway], backends: list[Backend], config: str
) -> None:
    gw = gateway_factory(DESCRIPTORS, config, backends=backends)
    send(gw, "/sticky", USERS)
    placement = served_by(gw, "/sticky")
    assert set(placement) == set(USERS), placement
    for user in USERS:
        # All 12 requests on one backend (which one depends on the hash of the host addresses).
        assert len(placement[user]) == 1, f"{user} spread over {placement[user]}"
        assert sum(placement[user].values()) == REQUESTS_PER_USER


def test_round_robin_spreads_one_user_over_backends(
    gateway_factory: Callable[..., Gateway], backends: list[Backend]
) -> None:
    gw = gateway_factory(DESCRIPTORS, "gateway-round-robin.yaml", backends=backends)
    send(gw, "/spread", ("alice",))
    placement = served_by(gw, "/spread")["alice"]
    assert sum(placement.values()) == REQUESTS_PER_USER
    # The contrast with the hashing variants: the same user lands on several backends. (The
    # harness runs Envoy with one worker, so this is in fact an exact rotation.)
    assert len(placement) > 1, placement
    assert sorted(placement.values()) == [4, 4, 4], placement
