"""`reserve:` on a limit (docs/token-budgets.md) is checked at load, and its errors say where:
the line of the `reserve:` field and the limit's node path."""

from __future__ import annotations

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.core.limits import Reserve


def config(reserve: str, extra: str = "") -> str:
    return (
        "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit:\n"
        "      unit: hour\n      requests_per_unit: 1000\n"
        f"{extra}      reserve: {reserve}\n"
    )


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", text)])
    return info.value


def test_a_valid_reserve_loads_with_its_defaults() -> None:
    loaded = load_files([("f.yaml", config("{id_key: request_id, settle_key: settle}"))])
    domain = loaded.domains["d"]
    (limit,) = domain.root.ordered[0].limits
    assert limit.reserve == Reserve("request_id", "settle", 0, 600_000)
    assert (domain.reserve_ids, domain.reserve_settles) == ({"request_id"}, {"settle"})


def test_expire_after_takes_a_unit() -> None:
    text = config("{id_key: r, settle_key: s, expire_after: 2m, estimate: 800}")
    (limit,) = load_files([("f.yaml", text)]).domains["d"].root.ordered[0].limits
    assert limit.reserve == Reserve("r", "s", 800, 120_000)


@pytest.mark.parametrize(("reserve", "extra", "says"), [
    ("{settle_key: s}", "", "needs id_key"),
    ("{id_key: r, settle_key: r}", "", "must differ"),
    ("{id_key: r, settle_key: s, expire_after: soon}", "", "is not a duration"),
    ("{id_key: r, settle_key: s, expire_after: 0s}", "", "between 1s and"),
    ("{id_key: r, settle_key: s, estimat: 5}", "", "unknown field 'estimat'"),
    ("{id_key: r, settle_key: s, estimate: -1}", "", "estimate"),
    ("yes", "", "must be a map"),
    ("{id_key: r, settle_key: s}", "      algorithm: token_bucket\n", "applies to fixed_window"),
    ("{id_key: r, settle_key: s}", "      overdraft: 10\n", "overdraft"),
])
def test_a_wrong_reserve_is_refused_where_it_is(reserve: str, extra: str, says: str) -> None:
    exc = error_of(config(reserve, extra))
    assert says in exc.message, exc.message
    assert exc.node is not None and exc.node.startswith("d.tenant.rate_limit"), exc.node
    assert exc.line == 7 + extra.count("\n"), exc


def test_domains_without_reserve_take_no_entries_out() -> None:
    text = ("domain: d\ndescriptors:\n  - key: request_id\n"
            "    rate_limit: {unit: hour, requests_per_unit: 1}\n")
    domain = load_files([("f.yaml", text)]).domains["d"]
    assert not domain.reserve_ids and not domain.reserve_settles
