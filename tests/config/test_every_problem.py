"""Issue 33, "errors that stop at the first problem": one run names every problem of a file.

`rls check-config` and `rls serve`'s start-up error report every independent problem of a
file (YAML syntax errors aside: the parser stops there), in line order, each with its file,
line and node. A ConfigError that carries several keeps the first one's fields, so a caller
that knows of one error still reads a located one. YAML syntax errors say the column and
what usually causes them; a bad unit says which unit was meant and which there are; a taken
port says so and names the flag that moves it.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from support.net import free_port
from support.rls_cli import RLS, ROOT, clean_env, rls

from rls.config.errors import ConfigError
from rls.config.loader import load_files, load_paths

# A bad unit on line 5, a misspelled key on line 10, two bad values on lines 14 and 15.
SEVERAL = """domain: d
descriptors:
  - key: a
    rate_limit:
      unit: minutes
      requests_per_unit: 10
  - key: b
    rate_limit:
      unit: second
      request_per_unit: 5
  - key: c
    rate_limit:
      unit: hour
      requests_per_unit: -1
      algorithm: nope
"""


@pytest.mark.process
def test_check_config_reports_every_problem_of_a_file_in_line_order(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(SEVERAL)
    done = rls("check-config", str(cfg))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert [line.split(" (at ", 1)[1].split(",")[0] for line in lines] == [
        f"{cfg}:5", f"{cfg}:10", f"{cfg}:14", f"{cfg}:15"
    ], done.stderr
    assert lines[0].startswith(f"{cfg}: invalid rate limit unit 'minutes' (at {cfg}:5, "
                               "node d.a.rate_limit;")
    assert lines[1] == (
        f"{cfg}: config error, unknown key 'request_per_unit' (at {cfg}:10, node "
        "d.b.rate_limit.request_per_unit; did you mean 'requests_per_unit'?)"
    )
    assert "'requests_per_unit'" in lines[2] and "node d.c.rate_limit" in lines[2]
    assert "unknown algorithm 'nope'" in lines[3] and "node d.c.rate_limit" in lines[3]


def test_the_error_carries_every_problem_and_is_still_the_first_one() -> None:
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", SEVERAL)])
    error = info.value
    assert [p.line for p in error.problems] == [5, 10, 14, 15]
    assert str(error) == "f.yaml: invalid rate limit unit 'minutes'"
    assert (error.file, error.line, error.node) == ("f.yaml", 5, "d.a.rate_limit")
    assert error.detail().splitlines() == [p.located() for p in error.problems]



@pytest.mark.parametrize("top, first", [
    ("domian: d", "unknown key 'domian' (at f.yaml:1, node domian; did you mean 'domain'?)"),
    ('domain: ""', "config file cannot have empty domain (at f.yaml:1; add `domain: <name>`"),
])
def test_a_missing_domain_does_not_hide_the_problems_of_the_descriptors(
        top: str, first: str) -> None:
    """A file without a domain (`domian:`, a typo; or an empty one) still has its descriptors
    checked, under a stand-in name: the bad unit is not found only after the domain is fixed."""
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", SEVERAL.replace("domain: d", top))])
    problems = info.value.problems
    assert [p.line for p in problems] == [1, 5, 10, 14, 15], info.value.detail()
    assert first in problems[0].located(), problems[0].located()
    assert problems[1].node == "<no domain>.a.rate_limit", problems[1].located()

def test_a_node_and_its_children_are_both_checked() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    detailed_metric: maybe\n"
        "    descriptors:\n      - key: b\n        rate_limit: {unit: fortnight}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", text)])
    assert [(p.line, p.node) for p in info.value.problems] == [
        (4, "d.a"), (7, "d.a.b.rate_limit")
    ]


def test_every_bad_file_of_a_directory_is_reported_and_a_good_one_is_not(
        tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("domain: a\ndescriptors:\n  - key: k\n    ratelimit: 1\n")
    (tmp_path / "b.yaml").write_text("domain: b\ndescriptors:\n  - key: k\n")
    (tmp_path / "c.yaml").write_text("domain: c\ndescriptors:\n  - key: k\n    value: [x\n")
    with pytest.raises(ConfigError) as info:
        load_paths([str(tmp_path)])
    assert [(Path(p.file).name, p.line) for p in info.value.problems] == [
        ("a.yaml", 4), ("c.yaml", 5)
    ]


def test_a_bad_file_leaves_nothing_behind_for_the_next_one() -> None:
    """The domain of a rejected file is not registered: the next file naming the same domain
    is not reported as a duplicate (that would be a problem caused by the first)."""
    bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: nope}\n"
    good = "domain: d\ndescriptors:\n  - key: j\n"
    with pytest.raises(ConfigError) as info:
        load_files([("bad.yaml", bad), ("good.yaml", good)])
    assert [p.file for p in info.value.problems] == ["bad.yaml"]


@pytest.mark.process
def test_serve_start_up_error_names_every_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(SEVERAL)
    done = subprocess.run(
        [RLS, "serve", "--config", str(cfg), "--grpc-addr", f"127.0.0.1:{free_port()}",
         "--http-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, env=clean_env(), cwd=ROOT,
    )
    assert done.returncode == 1
    errors = [line for line in (done.stdout + done.stderr).splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors
    for line in (5, 10, 14, 15):
        assert f"(at {cfg}:{line}," in errors[0], errors[0]
    assert errors[0].endswith(f"(every problem: rls check-config {cfg})")


# ------------------------------------------------------------------ YAML syntax


@pytest.mark.parametrize(("text", "where", "words"), [
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: unit: second\n", "4:21",
     "indented deeper than the keys beside it"),
    ("domain: d\ndescriptors:\n  - key: a\n   value: b\n", "4:4",
     "check this line's indentation"),
    ("domain: d\ndescriptors:\n\t- key: a\n", "3:1", "replace the tab"),
])
def test_a_yaml_syntax_error_has_its_column_and_a_hint(text: str, where: str,
                                                       words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", text)])
    detail = info.value.detail()
    assert detail.startswith("f.yaml: error loading config file: yaml: line "), detail
    assert f"(at f.yaml:{where}; " in detail and words in detail, detail


# ------------------------------------------------------------------ unit names


@pytest.mark.parametrize(("unit", "meant"), [("minutes", "minute"), ("Hours", "hour"),
                                             ("sec", "second")])
def test_a_bad_unit_says_which_was_meant_and_lists_the_units(unit: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", f"domain: d\ndescriptors:\n  - key: k\n"
                               f"    rate_limit: {{unit: {unit}}}\n")])
    assert info.value.message == f"invalid rate limit unit '{unit}'"
    assert info.value.hint == (f"did you mean '{meant}'? valid units: second, minute, hour, "
                               "day, week, month, year")


def test_a_unit_like_no_other_lists_the_units() -> None:
    with pytest.raises(ConfigError) as info:
        load_files([("f.yaml", "domain: d\ndescriptors:\n  - key: k\n"
                               "    rate_limit: {unit: zzz}\n")])
    assert info.value.hint == "valid units: second, minute, hour, day, week, month, year"


# ------------------------------------------------------------------ taken ports


@pytest.mark.process
@pytest.mark.parametrize(("flag", "what"), [
    ("--grpc-addr", "gRPC"), ("--http-addr", "admin"), ("--extproc-addr", "ext_proc")
])
def test_a_taken_port_says_it_is_in_use_and_names_the_flag(flag: str, what: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {"--grpc-addr": f"127.0.0.1:{free_port()}",
                 "--http-addr": f"127.0.0.1:{free_port()}",
                 "--extproc-addr": f"127.0.0.1:{free_port()}", flag: addr}
        done = rls("serve", "--allow-empty-config", *(x for kv in ports.items() for x in kv),
                   "--cache-config", str(ROOT / "config" / "cache.yaml"), timeout=60)
    assert done.returncode != 0
    assert (f"cannot listen on {addr} ({what}): port {addr.split(':')[1]} is already in use "
            f"(another rls, or another program, listens on it); choose another address "
            f"with {flag}") in done.stderr, done.stderr


@pytest.mark.process
def test_strict_start_up_names_every_warning(tmp_path: Path) -> None:
    cfg = tmp_path / "warn.yaml"
    cfg.write_text("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n"
                   "  - key: b\n    rate_limit: {unit: minute}\n")
    done = subprocess.run(
        [RLS, "serve", "--strict", "--config", str(cfg), "--grpc-addr",
         f"127.0.0.1:{free_port()}", "--http-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, env=clean_env(), cwd=ROOT,
    )
    assert done.returncode == 1
    errors = [line for line in (done.stdout + done.stderr).splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors
    assert f"(at {cfg}:4, node d.a.rate_limit) | " in errors[0], errors[0]
    assert f"(at {cfg}:6, node d.b.rate_limit) (every problem: " in errors[0], errors[0]
