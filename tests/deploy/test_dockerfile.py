"""The Dockerfile and .dockerignore agree with the package (no Docker engine needed).

What is checked, against the sources rather than copies of their values:
- the base images are Python 3.11 (`requires-python` of pyproject.toml), the build is
  multi-stage (a wheel is built, then installed into a venv of the final stage);
- ENTRYPOINT is a console script of [project.scripts] whose target imports;
- CMD parses with rls's own argument parser; EXPOSE lists exactly the gRPC port of
  rls/settings/model.py's default `grpc_addr` and the admin port, which is the default port of
  `http_addr`; CMD leaves the admin listener on loopback (safe by default), and moving it off
  loopback with RLS_HTTP_ADDR is refused unless RLS_ADMIN_TOKEN is set too;
- the HEALTHCHECK URL path is a route of the real admin app (rls/admin/app.py), and the
  HEALTHCHECK command itself, pointed at a real `rls serve`, exits 0 while it is healthy and
  non-zero once it is gone;
- xds-protos' old OpenTelemetry protos are replaced by opentelemetry-proto's after the wheel's
  install, in the same venv;
- USER is not root; every COPY source exists and survives .dockerignore; the build stage
  gets what `pip wheel .` needs (pyproject, the readme it names, rls/ and lua/ behind the
  rls/lua symlink with every Lua file the Redis script loads);
- the descriptor files copied to /etc/rls/config pass `rls check-config` together.
Not checked: that `docker build` succeeds (no engine here) — e.g. apt/pip network access.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path

import pytest

from rls.admin.app import AdminState, create_app
from rls.cli.check_config import check_config
from rls.cli.main import parser
from rls.cli.serve import settings_from
from rls.process.listeners import split_addr
from rls.process.server import build_app
from rls.settings import Settings
from rls.stores.redis.leases import LEASE_FILE
from rls.stores.redis.scripts import ALGORITHM_FILES

from .helpers import ROOT

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation"
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        assert result, "an instruction before the first FROM"
        result[-1].append(ins)
    return result


def one(name: str, stage: list[tuple[str, str]] | None = None) -> str:
    found = [args for ins, args in (stage or instructions()) if ins == name]
    assert found, f"no {name}"
    return found[-1]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def test_python_311_base_images_and_multi_stage_wheel_build():
    requires = PYPROJECT["project"]["requires-python"]
    minimum = re.fullmatch(r">=\s*(\d+\.\d+)", requires)
    assert minimum, requires
    all_stages = stages()
    assert len(all_stages) >= 2, "multi-stage: build the wheel, then a clean runtime"
    for stage in all_stages:
        image = one("FROM", stage).split()[0]
        assert re.fullmatch(rf"python:{re.escape(minimum.group(1))}-slim(-\w+)?", image), image
    build, final = all_stages[0], all_stages[-1]
    assert one("FROM", build).split()[-1] == "build"
    assert "pip wheel" in one("RUN", build)
    copies = [args for ins, args in final if ins == "COPY"]
    assert any(c.startswith("--from=build") for c in copies)
    install = one("RUN", final)
    assert "python -m venv /opt/rls" in install and "/opt/rls/bin/pip install" in install
    env = " ".join(args for ins, args in final if ins == "ENV")
    assert "PATH=/opt/rls/bin:" in env


def test_opentelemetry_protos_are_put_back_after_the_wheel_is_installed():
    """xds-protos, installed with the wheel, overwrites opentelemetry-proto's files: the repair
    must come after that install, in the same venv (tests/tracing/test_install.py runs it)."""
    steps = [step.strip() for step in one("RUN", stages()[-1]).split("&&")]
    wheel = next(i for i, step in enumerate(steps) if "/tmp/wheels/*.whl" in step)
    repair = [i for i, step in enumerate(steps) if "--force-reinstall" in step]
    assert repair and repair[0] > wheel, steps
    assert steps[repair[0]].startswith("/opt/rls/bin/pip install ")
    assert '"opentelemetry-proto==$(/opt/rls/bin/pip show opentelemetry-proto' in steps[repair[0]]


def test_entrypoint_is_the_console_script_of_the_package():
    entry = exec_form(one("ENTRYPOINT"))
    assert entry == ["rls"]
    scripts = PYPROJECT["project"]["scripts"]
    assert "rls" in scripts
    module, _, func = scripts["rls"].partition(":")
    assert callable(getattr(import_module(module), func))


def test_cmd_parses_and_exposed_ports_are_the_settings_defaults():
    cmd = exec_form(one("CMD"))
    assert cmd[0] == "serve"
    settings = settings_from(parser().parse_args(cmd))
    defaults = Settings()
    assert settings.config == ["/etc/rls/config"]
    grpc_host, grpc_port = split_addr(settings.grpc_addr)
    http_host, http_port = split_addr(settings.http_addr)
    assert (grpc_host, grpc_port) == split_addr(defaults.grpc_addr) == ("0.0.0.0", 8081)
    assert http_port == split_addr(defaults.http_addr)[1] == 8080
    assert http_host == "127.0.0.1", "without a token the admin API must stay on loopback"
    exposed = {int(p.split("/")[0]) for p in one("EXPOSE").split()}
    assert exposed == {grpc_port, http_port}


def test_exposing_the_admin_port_needs_a_token(monkeypatch):
    """The documented way out (`-e RLS_HTTP_ADDR=0.0.0.0:8080`) works only with a token."""
    cmd = exec_form(one("CMD"))
    monkeypatch.delenv("RLS_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("RLS_ADMIN_INSECURE", raising=False)
    monkeypatch.setenv("RLS_HTTP_ADDR", "0.0.0.0:8080")
    with pytest.raises(ValueError, match="not on loopback and RLS_ADMIN_TOKEN is not set"):
        settings_from(parser().parse_args(cmd))
    monkeypatch.setenv("RLS_ADMIN_TOKEN", "t0ken")
    assert settings_from(parser().parse_args(cmd)).http_addr == "0.0.0.0:8080"


def healthcheck_command() -> list[str]:
    args = one("HEALTHCHECK")
    assert "CMD" in args
    options, _, command = args.partition("CMD")
    assert "--timeout" in options
    return exec_form(command.strip())


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_healthcheck_probes_an_admin_route_on_the_admin_port():
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"], "slim images have no curl"
    (url,) = re.findall(r"https?://[^'\"]+", command[2])
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/\S*)", url)
    assert match, url
    assert int(match.group(1)) == split_addr(Settings().http_addr)[1]
    app = build_app(Settings())
    admin = create_app(AdminState(app.service, app.metrics, app.holder.current))
    routes = {r.canonical for r in admin.router.resources()}
    assert match.group(2) in routes, routes


def test_healthcheck_command_against_a_real_server(rls_factory):
    rls = rls_factory(ROOT / "config" / "example.yaml")
    code = healthcheck_command()[2].replace("127.0.0.1:8080", f"127.0.0.1:{rls.http_port}")
    run = [sys.executable, "-c", code]
    assert subprocess.run(run, capture_output=True, timeout=30).returncode == 0
    rls.stop()
    assert subprocess.run(run, capture_output=True, timeout=30).returncode != 0


def test_runs_as_non_root():
    final = stages()[-1]
    user = one("USER", final).split(":")[0]
    assert user not in ("root", "0"), user
    if not user.isdigit():
        assert any(ins == "RUN" and "useradd" in args and user in args for ins, args in final)
    else:
        assert any(ins == "RUN" and f"--uid {user}" in args for ins, args in final)


# --------------------------------------------------------------------------- build context


def _pattern(p: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        elif p[i] == "[":
            end = p.index("]", i)
            out += p[i:end + 1]
            i = end + 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile(out)


def ignored(rel: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a pattern matching a
    directory covers what is inside; `!` re-includes."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            neg = line.startswith("!")
            patterns.append((neg, _pattern(line.lstrip("!").strip("/"))))
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for neg, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            result = not neg
    return result


def copy_sources() -> list[tuple[str, str, str]]:
    """(stage name, source, destination) of every COPY from the build context."""
    out = []
    for stage in stages():
        name = one("FROM", stage).split()[-1]
        for ins, args in stage:
            if ins == "COPY" and not args.startswith("--from"):
                *sources, dest = shlex.split(args)
                out += [(name, src, dest) for src in sources]
    return out


def test_copy_sources_exist_and_survive_dockerignore():
    assert not ignored("pyproject.toml") and ignored("tests/conftest.py")
    assert ignored("rls/cli/__pycache__/main.cpython-311.pyc") and not ignored("rls/cli/main.py")
    for _, src, _ in copy_sources():
        matches = sorted(ROOT.glob(src.rstrip("/")))
        assert matches, f"COPY {src}: nothing in the repository"
        for path in matches:
            rel = path.relative_to(ROOT).as_posix()
            assert not ignored(rel), f"COPY {src}: {rel} is excluded by .dockerignore"


def test_build_stage_has_everything_pip_wheel_needs(tmp_path: Path):
    build = {src.rstrip("/") for stage, src, _ in copy_sources() if stage == "build"}
    readme = PYPROJECT["project"]["readme"]
    assert {"pyproject.toml", readme, "rls", "lua"} <= build, build
    lua = ROOT / "rls" / "lua"
    assert lua.is_symlink() and lua.resolve() == (ROOT / "lua").resolve()
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["rls"]
    assert "lua/*.lua" in data
    shipped = {p.name for p in lua.glob("*.lua") if not ignored(f"lua/{p.name}")}
    assert {*ALGORITHM_FILES, "decide.lua", LEASE_FILE} <= shipped


@pytest.mark.process
def test_default_descriptor_files_pass_check_config():
    files = sorted(
        {p for _, src, dest in copy_sources() if dest.startswith("/etc/rls/config")
         for p in ROOT.glob(src)}
    )
    names = {p.name for p in files}
    assert "example.yaml" in names
    assert {f"scenario-{n}.yaml" for n in ("gateway", "open-platform", "ads-frequency",
                                           "payments")} <= names
    done = subprocess.run([sys.executable, "-m", "rls", "check-config", *map(str, files)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["gateway", "open-platform", "ads-frequency", "payments"])
def test_each_scenario_passes_check_config_alone(name, capsys):
    assert check_config([str(ROOT / "config" / f"scenario-{name}.yaml")], False) == 0
    assert capsys.readouterr().out.startswith("OK")
