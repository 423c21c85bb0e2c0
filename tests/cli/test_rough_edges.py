"""Issue 25 item 3: the rough edges of a first hour with rls, each as the user meets it.

- a mistyped flag of a sub-command gets that sub-command's usage and "did you mean";
- `value: *admin*` (unquoted) gets a hint to quote it, and configuration.md shows the quoting;
- a config that does not load at start-up is one line: the first error with its location, and
  the `rls check-config` command that lists every problem;
- `rls check-config` knows counters configs (docs/counters.md's example checks clean) and
  cache rules files, by their fields or by flag;
- `rls top` ends cleanly on Ctrl-C at any moment, even while it is still importing.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.net import free_port
from support.rls_cli import RLS, ROOT, clean_env, rls

pytestmark = pytest.mark.process

GOOD = """domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def doc_block(doc: str, first_line: str) -> str:
    """The fenced YAML block of `doc` that starts with `first_line`."""
    text = (ROOT / "docs" / doc).read_text()
    found = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith(first_line)]
    assert len(found) == 1, f"{doc}: a yaml block starting {first_line!r}"
    return found[0]


# ------------------------------------------------------------------ sub-command typos


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["serve", "--confg", "config/"], "usage: rls serve", "did you mean --config?"),
    (["serve", "--redis-usl=redis://x"], "usage: rls serve", "did you mean --redis-url?"),
    (["check-config", "--strct", "config/"], "usage: rls check-config",
     "did you mean --strict?"),
    (["top", "--intervl", "1"], "usage: rls top", "did you mean --interval?"),
    (["demo", "--fre-ports"], "usage: rls demo", "did you mean --free-ports?"),
])
def test_a_mistyped_flag_gets_the_sub_commands_usage_and_a_suggestion(
        argv: list[str], usage: str, hint: str) -> None:
    done = rls(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(usage), done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"rls {argv[0]}: error: unrecognized arguments: {argv[1]}"), error
    assert error.endswith(f"({hint})"), error


def test_a_mistyped_sub_command_gets_the_closest_one() -> None:
    done = rls("serv", "--config", "config/")
    assert done.returncode == 2
    assert "unknown command 'serv'; did you mean 'serve'?" in done.stderr


def test_an_unknown_flag_close_to_nothing_gets_no_suggestion() -> None:
    done = rls("serve", "--zzzzzz")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("unrecognized arguments: --zzzzzz")


# ------------------------------------------------------------------ unquoted `*`


@pytest.mark.parametrize(("value", "quoted", "meaning"), [
    ("*admin*", '"*admin*"', "starts an alias"),
    ("*admin", '"*admin"', "starts an alias"),  # YAML: an undefined alias
    ("*", '"*"', "starts an alias"),
    ("@home", '"@home"', "is reserved"),
])
def test_a_value_read_as_yaml_syntax_gets_a_hint_to_quote_it(
        tmp_path: Path, value: str, quoted: str, meaning: str) -> None:
    cfg = tmp_path / "star.yaml"
    cfg.write_text(GOOD.replace("  - key: k\n", f"  - key: k\n    value: {value}\n"))
    done = rls("check-config", str(cfg))
    assert done.returncode == 1
    assert done.stderr.startswith(f"{cfg}: error loading config file: yaml: line 4: ")
    assert done.stderr.strip().endswith(
        f"; {value[0]!r} at the start of a value {meaning} in YAML; quote the value: "
        f"{quoted})"
    ), done.stderr
    assert f"(at {cfg}:4:" in done.stderr  # line and column


def test_configuration_md_shows_the_quoting_and_the_hint_it_quotes(tmp_path: Path) -> None:
    block = doc_block("configuration.md", "domain: admin_api")
    good, bad = tmp_path / "quoted.yaml", tmp_path / "unquoted.yaml"
    good.write_text(block)
    bad.write_text(block.replace('"*admin*"', "*admin*"))
    assert rls("check-config", str(good)).returncode == 0
    done = rls("check-config", str(bad))
    assert done.returncode == 1
    message = done.stderr.strip().removeprefix(f"{bad}: ").replace(f"{bad}:", "unquoted.yaml:")
    doc = " ".join((ROOT / "docs" / "configuration.md").read_text().split())
    assert f"`{message}`" in doc, message


def test_a_value_with_a_star_inside_needs_no_quotes(tmp_path: Path) -> None:
    cfg = tmp_path / "inner.yaml"
    cfg.write_text(GOOD.replace("  - key: k\n", "  - key: k\n    value: /api/*\n"))
    assert rls("check-config", str(cfg)).returncode == 0


# ------------------------------------------------------------------ start-up error


def test_a_config_error_at_start_up_is_one_line_with_where_and_what_to_run(
        tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(GOOD.replace("minute", "minte"))
    done = subprocess.run(
        [RLS, "serve", "--config", str(cfg), "--strict", "--grpc-addr", "127.0.0.1:0",
         "--http-addr", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, env=clean_env(), cwd=ROOT,
    )
    assert done.returncode == 1
    errors = [line for line in (done.stdout + done.stderr).splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors
    assert errors[0].endswith(
        f"cannot start: the config does not load: {cfg}: invalid rate limit unit 'minte' "
        f"(at {cfg}:4, node d.k.rate_limit; did you mean 'minute'? valid units: second, "
        f"minute, hour, day, week, month, year) (every problem: rls check-config --strict {cfg})"
    ), errors[0]
    assert "--allow-empty-config" not in done.stdout + done.stderr


# ------------------------------------------------------------------ check-config kinds


def test_the_counters_config_of_counters_md_checks_clean(tmp_path: Path) -> None:
    cfg = tmp_path / "counters.yaml"
    cfg.write_text(doc_block("counters.md", "default_timezone:"))
    done = rls("check-config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("1 counters config file(s)")
    with_descriptors = rls("check-config", str(ROOT / "config"), str(cfg))
    assert with_descriptors.returncode == 0, with_descriptors.stderr


def test_a_bad_counters_config_fails_as_rls_serve_would(tmp_path: Path) -> None:
    cfg = tmp_path / "counters.yaml"
    cfg.write_text("default_timezone: UTC\ndomains:\n  ads: {timezone: Mars/Base}\n")
    done = rls("check-config", str(cfg))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"{cfg}: counters config: domain 'ads': unknown time zone 'Mars/Base'"
    )


def test_flags_name_a_files_kind_outright(tmp_path: Path) -> None:
    counters = tmp_path / "counters.yaml"
    counters.write_text(doc_block("counters.md", "default_timezone:"))
    done = rls("check-config", "--counters-config", str(counters),
               "--cache-config", str(ROOT / "config" / "cache.yaml"))
    assert done.returncode == 0, done.stderr
    assert "1 cache rules file(s), 1 counters config file(s)" in done.stdout
    # A descriptor file named as a counters config is checked as one, and refused.
    wrong = rls("check-config", "--counters-config", str(ROOT / "config" / "example.yaml"))
    assert wrong.returncode == 1
    assert "counters config: unknown fields ['descriptors', 'domain']" in wrong.stderr


def test_check_config_help_says_how_kinds_are_told_apart() -> None:
    text = " ".join(rls("check-config", "--help").stdout.split())
    assert "--counters-config FILE" in text and "--cache-config FILE" in text
    assert "counters config when it has counters fields" in text


# ------------------------------------------------------------------ rls top and Ctrl-C


def loaded(pid: int, names: tuple[str, ...]) -> bool:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except FileNotFoundError:
        return True  # exited: communicate() shows why
    return any(name in maps for name in names)


# Bounds, not expected durations: each wait below ends at its signal (the imports have begun,
# the first screen is out, the process has exited). On a cold machine (the first run of a
# fresh clone: no bytecode yet, every suite competing for the CPU) starting Python and the
# CLI's imports can take many times what they take warm, so the bounds are generous.
START_BOUND = 120.0  # until the CLI's imports have begun / its first screen is out
EXIT_BOUND = 120.0  # from Ctrl-C to the exit


def first_lines(proc: subprocess.Popen[str], count: int, bound: float) -> str:
    """The first `count` lines of the process's stdout, waiting at most `bound` seconds (a
    reader thread: readline alone could wait forever)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for _ in range(count):
            lines.put(proc.stdout.readline())

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + bound
    out = []
    for _ in range(count):
        out.append(lines.get(timeout=max(deadline - time.monotonic(), 0.001)))
    return "".join(out)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
@pytest.mark.parametrize("after", [0.0, 0.05, 0.1, 0.2, 0.35, "first screen"])
def test_ctrl_c_at_any_moment_of_rls_top_exits_cleanly(after: float | str) -> None:
    proc = subprocess.Popen(
        [RLS, "top", "--admin", f"http://127.0.0.1:{free_port()}", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )
    try:
        if after == "first screen":
            assert "unreachable" in first_lines(proc, 2, START_BOUND)
        else:
            # Past the interpreter's own start-up (not rls's to change): the CLI's imports
            # have begun once the first extension module they pull in is mapped.
            deadline = time.monotonic() + START_BOUND
            while not loaded(proc.pid, ("_ssl.", "_yaml.")):
                assert time.monotonic() < deadline, "rls top never started importing"
                time.sleep(0.002)
            time.sleep(float(after))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=EXIT_BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
