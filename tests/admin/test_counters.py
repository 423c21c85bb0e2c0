"""POST /counters (query, charges nothing) and POST /add (charge for callers not behind Envoy),
and their CLI `rls counters [--add N]`, on a real `rls serve` with the memory and Redis
backends (README "Admin API")."""

from __future__ import annotations

import json

import grpc
import pytest
from support.calls import (
    AUTH,
    OK,
    OVER,
    TOKEN,
    Grpc,
    cli,
    counters_body,
    descriptor,
    descriptor_args,
    http,
    item,
    query,
    uid,
    used,
)

memory_only = pytest.mark.parametrize("srv", ["memory"], indirect=True)


def _limits(payload: dict, index: int = 0) -> list[dict]:
    return payload["results"][index]["limits"]


# -- POST /counters -------------------------------------------------------------------------


def test_query_charges_nothing_and_sees_grpc_charges(srv):
    v = uid()
    first = query(srv.http_url, "ops", [("k", v)])
    second = query(srv.http_url, "ops", [("k", v)])
    for status, payload in (first, second):
        assert status == 200, payload
        assert payload["domain"] == "ops"
        assert payload["results"][0]["entries"] == [{"key": "k", "value": v}]
        (lim,) = _limits(payload)
        assert lim["key"] == "ops.k"
        assert (lim["requests_per_unit"], lim["unit"]) == (5, "HOUR")
        assert (lim["used"], lim["remaining"], lim["over_limit"]) == (0, 5, False)
        assert 0 < lim["reset_seconds"] <= 3600

    with Grpc(srv.grpc_addr) as client:
        resp = client.one("ops", ("k", v))
        assert resp.overall_code == OK and resp.statuses[0].limit_remaining == 4
        for _ in range(2):  # repeated queries still do not charge
            status, payload = query(srv.http_url, "ops", [("k", v)])
            (lim,) = _limits(payload)
            assert (lim["used"], lim["remaining"]) == (1, 4), payload
        # The query did not eat quota: the next gRPC call sees 3 left.
        assert client.one("ops", ("k", v)).statuses[0].limit_remaining == 3
    assert used(srv.http_url, "ops", [("k", v)]) == 2


def test_query_reports_every_matched_limit_and_over_limit(srv):
    m, t = uid(), uid()
    with Grpc(srv.grpc_addr) as client:
        for _ in range(3):
            client.one("ops", ("multi", m))
        codes = [client.one("ops", ("two", t)).overall_code for _ in range(3)]
    assert codes == [OK, OK, OVER]
    status, payload = query(srv.http_url, "ops", [("multi", m)], [("two", t)])
    assert status == 200, payload
    multi = sorted(_limits(payload, 0), key=lambda x: x["requests_per_unit"])
    assert [(x["requests_per_unit"], x["unit"], x["used"], x["remaining"]) for x in multi] == [
        (7, "DAY", 3, 4),
        (1000, "SECOND", multi[1]["used"], multi[1]["remaining"]),  # second window may roll
    ]
    (two,) = _limits(payload, 1)
    # The rejected third call charged nothing.
    assert (two["used"], two["remaining"], two["over_limit"]) == (2, 0, True)
    assert 0 < two["reset_seconds"] <= 3600


def test_query_batch_limit_unknown_domain_and_unmatched(srv):
    values = [uid() for _ in range(30)]
    status, payload = query(srv.http_url, "ops", *[[("k", v)] for v in values])
    assert status == 200, payload
    assert [r["entries"][0]["value"] for r in payload["results"]] == values
    assert all(len(r["limits"]) == 1 and r["limits"][0]["used"] == 0 for r in payload["results"])

    status, payload = query(srv.http_url, "ops", *[[("k", v)] for v in [*values, uid()]])
    assert status == 400, payload
    assert "30" in payload["error"]

    status, payload = query(srv.http_url, "no-such-domain", [("k", "v")], [("a", "b")])
    assert status == 200, payload
    assert [r["limits"] for r in payload["results"]] == [[], []]

    status, payload = query(srv.http_url, "ops", [("nolimit", "x")], [("k", values[0])])
    assert status == 200, payload
    assert payload["results"][0]["limits"] == []
    assert len(payload["results"][1]["limits"]) == 1


@memory_only
def test_counters_cli_prints_the_same_json(srv):
    k, m = uid(), uid()
    with Grpc(srv.grpc_addr) as client:
        client.one("ops", ("k", k), hits=2)
    descs = [[("k", k)], [("multi", m)], [("nolimit", "x")]]
    status, expected = query(srv.http_url, "ops", *descs)
    assert status == 200
    out = cli("counters", "--admin", srv.http_url, "--domain", "ops", *descriptor_args(descs))
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)

    def strip(payload: dict) -> dict:  # reset_seconds may tick between the two reads
        for result in payload["results"]:
            for lim in result["limits"]:
                lim.pop("reset_seconds")
                if lim["unit"] == "SECOND":
                    lim.pop("used"), lim.pop("remaining"), lim.pop("over_limit")
        return payload

    assert strip(printed) == strip(expected)
    assert printed["results"][0]["limits"][0]["used"] == 2
    # Querying through the CLI charged nothing either.
    assert used(srv.http_url, "ops", [("k", k)]) == 2


# -- POST /add ------------------------------------------------------------------------------


def test_add_answers_each_item_in_order(srv):
    k, t, a = uid(), uid(), uid()
    items = [
        item("ops", [("k", k)], hits=2),
        item("ops", [("two", t)]),
        item("no-such-domain", [("x", "y")]),
        item("ops", [("app", a), ("path", "/p")]),
        item("ops", [("k", k)]),  # same counter again: sees the first item's charge
        item("ops", [("two", t)], hits=5),  # over: rejected whole
    ]
    status, payload = http(srv.http_url, "POST", "/add", {"items": items}, headers=AUTH)
    assert status == 200, payload
    results = payload["results"]
    assert len(results) == len(items)
    summary = [
        (
            r["overallCode"],
            [(s.get("code", "OK"), int(s.get("limitRemaining", 0))) for s in r["statuses"]],
        )
        for r in results
    ]
    assert summary == [
        ("OK", [("OK", 3)]),
        ("OK", [("OK", 1)]),
        ("OK", [("OK", 0)]),
        ("OK", [("OK", 99)]),
        ("OK", [("OK", 2)]),
        ("OVER_LIMIT", [("OVER_LIMIT", 0)]),
    ]
    assert results[3]["statuses"][0]["currentLimit"]["name"] == "app_path"
    assert "currentLimit" not in results[2]["statuses"][0]
    assert used(srv.http_url, "ops", [("k", k)]) == 3
    assert used(srv.http_url, "ops", [("two", t)]) == 1


INVALID_ITEMS = {
    "empty domain": {"domain": "", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]},
    "empty key": {"domain": "ops", "descriptors": [{"entries": [{"key": "", "value": "v"}]}]},
    "no descriptors": {"domain": "ops"},
    "unknown field": {"domain": "ops", "nosuchfield": 1,
                      "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]},
    "not an object": ["ops"],
    # gRPC answers INVALID_ARGUMENT for this one (see the next test), so it is invalid too.
    "override with invalid unit": {
        "domain": "ops",
        "descriptors": [{"entries": [{"key": "k", "value": "v"}],
                         "limit": {"requestsPerUnit": 5, "unit": 99}}],
    },
}


@pytest.mark.parametrize(
    ("bad", "index"),
    [(bad, 1) for bad in INVALID_ITEMS] + [("empty domain", 0), ("empty key", 2)],
)
def test_add_batch_with_one_invalid_item_charges_nothing(srv, bad, index):
    a, b = uid(), uid()
    items = [item("ops", [("k", a)], hits=2), item("ops", [("k", b)])]
    items.insert(index, INVALID_ITEMS[bad])
    status, payload = http(srv.http_url, "POST", "/add", {"items": items}, headers=AUTH)
    assert status == 400, f"{bad}: HTTP {status} {payload}"
    assert [e["index"] for e in payload.get("errors", [])] == [index], payload
    assert (used(srv.http_url, "ops", [("k", a)]), used(srv.http_url, "ops", [("k", b)])) == (
        0,
        0,
    ), f"{bad}: a rejected batch charged its valid items"


@memory_only
def test_override_with_invalid_unit_is_invalid_on_grpc(srv):
    """Evidence that the item above is an invalid request, not a backend failure."""
    d = descriptor(("k", uid()))
    d.limit.requests_per_unit = 5
    d.limit.unit = 99
    with Grpc(srv.grpc_addr) as client, pytest.raises(grpc.RpcError) as err:
        client.call("ops", d)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_add_batch_size_and_shape(srv):
    values = [uid() for _ in range(31)]
    status, payload = http(
        srv.http_url, "POST", "/add",
        {"items": [item("ops", [("k", v)]) for v in values]}, headers=AUTH,
    )
    assert status == 400, payload
    assert all(used(srv.http_url, "ops", [("k", v)]) == 0 for v in values[:3])

    status, payload = http(
        srv.http_url, "POST", "/add",
        {"items": [item("ops", [("k", v)]) for v in values[:30]]}, headers=AUTH,
    )
    assert status == 200, payload
    assert len(payload["results"]) == 30
    status, payload = query(srv.http_url, "ops", *[[("k", v)] for v in values])
    assert status == 400  # 31 descriptors in a query
    status, payload = query(srv.http_url, "ops", *[[("k", v)] for v in values[:30]])
    assert [r["limits"][0]["used"] for r in payload["results"]] == [1] * 30

    for body in ({}, {"items": []}, {"items": "x"}, [1]):
        status, payload = http(srv.http_url, "POST", "/add", body, headers=AUTH)
        assert status == 400, (body, payload)
    status, payload = http(srv.http_url, "POST", "/add", raw=b"{not json", headers=AUTH)
    assert status == 400, payload


@memory_only
def test_counters_cli_add_charges_hits(srv):
    v = uid()
    out = cli(
        "counters", "--admin", srv.http_url, "--domain", "ops", "-d", f"k={v}", "--add", "3",
        env={"RLS_ADMIN_TOKEN": TOKEN},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    printed = json.loads(out.stdout)
    assert printed["results"][0]["overallCode"] == "OK"
    assert int(printed["results"][0]["statuses"][0]["limitRemaining"]) == 2
    assert used(srv.http_url, "ops", [("k", v)]) == 3
    # The same body through HTTP is what the CLI sent: one more hit of 1.
    status, _ = http(srv.http_url, "POST", "/add", {"items": [counters_body("ops", [("k", v)])]},
                     headers=AUTH)
    assert status == 200
    assert used(srv.http_url, "ops", [("k", v)]) == 4
