"""A fresh clone needs nothing beside it: the README's test command is CI's, every system
package comes from scripts/install-test-deps.sh (no test installs one mid-run), and the SSDB
tests find their server through `SSDB_SERVER`, skipped with one line of reason without it.

Only .ci/run may name the `shared/` folder that CI lays beside the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from .helpers import ROOT

INSTALL = ROOT / "scripts" / "install-test-deps.sh"
BUILD_SSDB = ROOT / "scripts" / "build-ssdb.sh"
CI_MARK = "# The README's test command:"


def readme_test_command() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line for b in blocks for line in b.splitlines() if line.endswith("pytest -q")]
    assert len(lines) == 1, lines
    return lines[0]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert CI_MARK in ci
    assert ci[ci.index(CI_MARK) + 1] == readme_test_command()
    assert readme_test_command().startswith("bash scripts/install-test-deps.sh && ")
    # ...with SSDB built from CI's copy of shared/, so the SSDB tests run there.
    before = "\n".join(ci[:ci.index(CI_MARK)])
    assert "scripts/build-ssdb.sh" in before and "export SSDB_SERVER" in before


def test_nothing_but_ci_names_the_folder_beside_the_repository():
    beside = re.compile(r"\.\./shared|/ \"shared\"|parent / .shared.|shared/(tools|vendor)/")
    found = []
    for base in ("rls", "tests", "docs", "scripts", "README.md", "pyproject.toml", "helm"):
        path = ROOT / base
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if f.is_file() and f.suffix in {".py", ".md", ".sh", ".toml", ".yaml", ".txt", ""}:
                text = f.read_text(errors="replace")
                if f != Path(__file__) and beside.search(text):
                    found.append(str(f.relative_to(ROOT)))
    assert not found, f"only .ci/run may use ../shared: {found}"


def installed_packages() -> dict[str, str]:
    """command -> Debian package, from the install script's table."""
    text = INSTALL.read_text()
    table = re.search(r"declare -A package=\((.*?)\n\)", text, re.S)
    assert table, "the install script's package table"
    return dict(re.findall(r"\[([\w+.-]+)\]=([\w+.-]+)", table.group(1)))


def test_every_program_the_tests_require_is_installed_by_the_one_script():
    required = set()
    for f in (ROOT / "tests").rglob("*.py"):
        text = f.read_text()
        required |= set(re.findall(r"require_binary\(\"([^\"]+)\", \"([^\"]+)\"\)", text))
        mid_run_apt = re.search(r"[\[(]\s*\"apt(-get)?\"", text)
        assert f == Path(__file__) or not mid_run_apt, f"{f} runs apt mid-test"
    assert {"redis-server", "prometheus", "promtool", "tmux", "curl"} <= {c for c, _ in required}
    packages = installed_packages()
    assert {(c, packages.get(c)) for c, _ in required} == required


def fake_path(tmp_path: Path, present: set[str]) -> tuple[dict[str, str], Path]:
    """A PATH holding only `present` (as stubs), the tools the script itself uses, an `id`
    saying root, and an apt-get that records its arguments."""
    bin_dir, record = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir()
    for tool in ("sort", "env", "cat"):
        real = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                              text=True, check=True).stdout.strip()
        (bin_dir / tool).symlink_to(real)
    stubs = {name: "#!/bin/sh\nexit 0\n" for name in present}
    stubs["id"] = "#!/bin/sh\necho 0\n"
    stubs["apt-get"] = f'#!/bin/sh\necho "$*" >> {record}\n'
    for name, body in stubs.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return {"PATH": str(bin_dir), "HOME": str(tmp_path)}, record


def test_install_script_does_nothing_when_everything_is_there(tmp_path: Path):
    env, record = fake_path(tmp_path, set(installed_packages()))
    done = subprocess.run(["/bin/bash", str(INSTALL)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert not record.exists(), "apt-get ran with nothing missing"


def test_install_script_installs_only_what_is_missing(tmp_path: Path):
    commands = installed_packages()
    env, record = fake_path(tmp_path, set(commands) - {"promtool", "tmux"})
    done = subprocess.run(["/bin/bash", str(INSTALL)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    calls = record.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].split()[-2:] == ["prometheus", "tmux"], calls


def run_pytest(env_ssdb: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSDB_SERVER"}
    if env_ssdb is not None:
        env["SSDB_SERVER"] = env_ssdb
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/response_cache/test_cache_store.py", "-k", "ssdb", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_without_ssdb_server_the_ssdb_tests_are_skipped_with_one_line_of_reason():
    done = run_pytest(None)
    assert done.returncode == 0, done.stdout + done.stderr
    reasons = [line for line in done.stdout.splitlines() if "SSDB_SERVER" in line]
    assert len(reasons) == 1, done.stdout
    grouped = re.match(r"SKIPPED \[(\d+)\] ", reasons[0])  # every SSDB test, one line
    assert grouped and "scripts/build-ssdb.sh" in reasons[0], reasons[0]
    assert re.search(rf"^{grouped[1]} skipped, \d+ deselected", done.stdout, re.M), done.stdout


def test_an_ssdb_server_setting_that_is_not_a_binary_fails_the_ssdb_tests(tmp_path: Path):
    missing = tmp_path / "no-ssdb-server"
    done = run_pytest(str(missing))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"SSDB_SERVER={missing}: no such executable" in done.stdout


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD_SSDB), *args], capture_output=True, text=True,
                          timeout=60)


def test_build_ssdb_needs_the_source_tarball(tmp_path: Path):
    done = run_build()
    assert done.returncode == 2 and "usage:" in done.stderr
    done = run_build(str(tmp_path / "ssdb-1.9.8.tar.gz"))
    assert done.returncode == 2 and "no such file" in done.stderr
    not_ssdb = tmp_path / "other-1.0.tar.gz"
    (tmp_path / "other-1.0").mkdir()
    (tmp_path / "other-1.0" / "README").write_text("not SSDB\n")
    with tarfile.open(not_ssdb, "w:gz") as tar:
        tar.add(tmp_path / "other-1.0", arcname="other-1.0")
    done = run_build(str(not_ssdb), str(tmp_path / "prefix"))
    assert done.returncode == 2 and "no Makefile" in done.stderr, done.stderr


def test_build_ssdb_reuses_a_binary_built_from_a_tarball_of_the_same_name(tmp_path: Path):
    tarball = tmp_path / "ssdb-9.9.tar.gz"
    tarball.write_bytes(b"")
    built = tmp_path / "prefix" / "ssdb-9.9" / "ssdb-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    done = run_build(str(tarball), str(tmp_path / "prefix"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(built)
