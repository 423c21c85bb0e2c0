"""The algorithm registry is the one list: everything that names algorithms agrees with it."""

from __future__ import annotations

from importlib import resources

from rls.config import model as config_model
from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.core.algorithms import ALGORITHMS, REGISTRY
from rls.core.algorithms.registry import ALGORITHM_NAMES, BURST_ALGORITHMS, KEY_TAGS
from rls.stores.redis.scripts import ALGORITHM_FILES, decide_script


def test_ids_tags_and_names_are_unique():
    assert len({s.id for s in REGISTRY}) == len({s.key_tag for s in REGISTRY}) == len(REGISTRY)
    assert len(set(ALGORITHM_NAMES)) == len(REGISTRY)


def test_every_algorithm_has_its_lua_file_and_a_memory_implementation():
    lua = resources.files("rls") / "lua"
    for spec in REGISTRY:
        assert (lua / spec.lua).is_file(), spec.lua
        assert spec.lua in ALGORITHM_FILES
        assert ALGORITHMS[spec.name] is spec.memory
        assert f"ALGOS[{spec.id}] = (function()" in decide_script([spec.name])


def test_config_takes_names_and_key_tags_from_the_registry():
    assert config_model.ALGORITHMS is ALGORITHM_NAMES  # one list, not a copy
    for spec in REGISTRY:
        limit = config_model.Limit(requests_per_unit=1, unit=config_model.Unit.MINUTE,
                                   algorithm=spec.name)
        assert limit.ident.startswith(KEY_TAGS[spec.name])
    assert set(BURST_ALGORITHMS) == {"token_bucket", "leaky_bucket", "gcra"}


def _config(algorithm: str) -> str:
    rate_limit = f"{{unit: minute, requests_per_unit: 1, algorithm: {algorithm}}}"
    return f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n"


def test_parser_accepts_exactly_the_registered_algorithms():
    for name in ALGORITHM_NAMES:
        load_files([("c.yaml", _config(name))])
    try:
        load_files([("c.yaml", _config("nope"))])
    except ConfigError as exc:
        assert "unknown algorithm 'nope'" in str(exc)
        assert ", ".join(ALGORITHM_NAMES) in str(exc)
    else:
        raise AssertionError("an unregistered algorithm was accepted")
