"""Issue 25 item 4: every `curl` and `rls` command in README.md and docs/*.md runs as printed.

Against one running rls set up as the docs describe it: the shipped descriptor files of
`config/`, a real redis-server, the counters config of docs/counters.md, the cache rules of
`config/cache.yaml` and an admin token (`$RLS_ADMIN_TOKEN` in the commands). The documented
`localhost:8080` / `127.0.0.1:8080` / `127.0.0.1:8081` are rewritten to this rls's ports, and
`curl` fails on an HTTP error (as `--fail-with-body`); a command documented with an error answer
must fail with that error; a documented JSON answer must have the real answer's fields. A
command that runs until stopped (`rls top` without `--once`, `rls serve` on free ports) must
still be running after a few seconds. Complete commands in running text run too.

A block marked `<!-- needs: … -->` is not run here (an Envoy demo, Kubernetes, SSDB, grpcurl,
a traffic log): the mark names what it needs, from KNOWN_NEEDS. Commands are run in document
order on the same rls, like a reader working through the docs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RlsProcess, free_port, http_get, wait_until
from support.processes import stop_process
from support.redis_server import RedisServer
from support.rls_cli import ROOT, clean_env

from .docblocks import DOCS, FENCE, Block, blocks

TOKEN = "docs-token"
KNOWN_NEEDS = {"envoy", "kubernetes", "ssdb", "grpcurl", "a traffic log"}
SHELLS = ("sh", "bash", "shell", "console")
COMMAND = re.compile(r"(curl|rls)\s")
RUNS_UNTIL_STOPPED = re.compile(r"^rls (serve|demo)\b|^rls top\b(?!.*--once)")


def _complete(text: str) -> bool:
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # a quote still open: the command goes on on the next line
        return False
    return True


def commands_of(block: Block) -> list[tuple[str, str]]:
    """(command, documented output) of each curl/rls command of a shell block: `$ ` lines of a
    console block (the lines up to the next `$ ` are its output), every line of a sh block;
    continued lines (`\\`, an open quote) joined."""
    found: list[tuple[str, str]] = []
    current: str | None = None
    for raw in block.body.splitlines():
        if current is not None:
            current += "\n" + raw
        else:
            line = raw.strip()
            if block.lang == "console" and not line.startswith("$ "):
                if found and line:
                    found[-1] = (found[-1][0], f"{found[-1][1]}{line}\n")
                continue
            line = line.removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            current = line
        if _complete(current):
            found.append((current, ""))
            current = None
    return [(c, out) for c, out in found if COMMAND.match(c)]


def documented_error(output: str) -> str | None:
    """The message of a documented error answer (`{"error": "…"}`, `{"code": "invalid", …}`):
    such a command must fail with an HTTP error that says the same."""
    if not output.startswith('{"error"') and '"code": "invalid"' not in output:
        return None
    found = re.search(r'"(?:error|message)": "([^"]*)"', output)
    assert found, output
    return found.group(1)


def documented() -> list[tuple[Block, str, str]]:
    return [(b, c, out) for b in blocks(*SHELLS) for c, out in commands_of(b)]


FENCED = FENCE
INLINE = re.compile(r"`((?:rls|curl) [^`\n]+)`")
PLACEHOLDER = re.compile(r"[\[<|…]|\.\.\.|(?:^|\s)(?:[A-Z]+|/\S*)(?=\s|$)")


def inline_commands() -> list[tuple[str, str]]:
    """Complete commands in running text (`rls switches --limiting-off on`). Left out: those
    with a placeholder (`[…]`, `<x>`, `PATH`, an absolute path of the reader's own), a bare
    sub-command name (`rls top`), `rls serve` / `rls demo` command-line pieces (`rls serve
    --strict` is a flag being described; the demo needs Envoy), curl without an address."""
    found = []
    for doc in DOCS:
        text = FENCED.sub("", doc.read_text(encoding="utf-8"))
        for m in INLINE.finditer(text):
            command = m.group(1).strip()
            words = command.split()
            if PLACEHOLDER.search(command):
                continue
            if words[0] == "rls" and not any(w.startswith("-") for w in words):
                continue  # a sub-command's name (`rls top`, `rls cache purge`)
            if re.match(r"rls (serve|demo)\b", command) and not command.endswith("--help"):
                continue
            if words[0] == "curl" and not re.search(r"(localhost|127\.0\.0\.1):", command):
                continue
            found.append((f"{doc.relative_to(ROOT)} (inline)", command))
    return sorted(set(found))


ALL = documented()
TO_RUN = [(b.where, c, out) for b, c, out in ALL if not b.needs] + [
    (where, c, "") for where, c in inline_commands()
]


def test_the_docs_have_commands_to_run() -> None:
    assert len(TO_RUN) >= 20, TO_RUN
    assert any(c.startswith("curl") for _, c, _ in TO_RUN)
    assert any(c.startswith("rls ") for _, c, _ in TO_RUN)
    assert any(documented_error(out) for _, _, out in TO_RUN)


def test_commands_not_run_here_say_what_they_need() -> None:
    for block, command, _ in ALL:
        assert set(block.needs) <= KNOWN_NEEDS, (block.where, block.needs, command)


def test_a_console_block_yields_its_commands_not_its_output() -> None:
    block = Block("x.md:1", "console", "$ curl -s localhost:8080/a \\\n    -d '{\"a\":\n 1}'\n"
                  "{\"output\": 1}\n$ rls top --once   # a comment\nrls top - output\n",
                  None, "")
    assert commands_of(block) == [
        ("curl -s localhost:8080/a \\\n    -d '{\"a\":\n 1}'", '{"output": 1}\n'),
        ("rls top --once   # a comment", "rls top - output\n"),
    ]


def _counters_config() -> str:
    doc = (ROOT / "docs" / "counters.md").read_text(encoding="utf-8")
    found = re.search(r"```yaml\n(default_timezone:.*?)```", doc, re.S)
    assert found, "docs/counters.md lost its counters config example"
    return found.group(1)


def _post_json(rls: RlsProcess, domain: str, entries: list[tuple[str, str]]) -> None:
    body = json.dumps({"domain": domain, "descriptors": [
        {"entries": [{"key": k, "value": v} for k, v in entries]}]})
    request = urllib.request.Request(
        rls.http_url + "/json", data=body.encode(), method="POST",
        headers={"content-type": "application/json", "authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200
    except urllib.error.HTTPError as exc:
        assert exc.code == 429, exc  # over the limit: what the second loop is for


@pytest.fixture(scope="module")
def docs_rls(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[RlsProcess]:
    redis_server.client().flushall()
    tmp = tmp_path_factory.mktemp("docs-rls")
    counters = tmp / "counters.yaml"
    counters.write_text(_counters_config())
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp / "rls.log"
    cmd = [sys.executable, "-m", "rls", "serve", "--config", str(ROOT / "config"),
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
           "--redis-url", redis_server.url, "--counters-config", str(counters),
           "--cache-config", str(ROOT / "config" / "cache.yaml")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                env=clean_env(RLS_ADMIN_TOKEN=TOKEN))
    rls = RlsProcess(proc, grpc_port, http_port, log_path)
    try:
        wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, timeout=30,
                   what="rls /healthcheck")
        # Traffic first, as the documented outputs assume: a call in /metrics, a caller over
        # its limit in /top (not one a documented command uses).
        _post_json(rls, "open_platform", [("app", "42"), ("ip", "10.0.0.1")])
        for _ in range(31):  # gateway.api_items.user: 30 per minute
            _post_json(rls, "gateway", [("api", "items"), ("user", "mallory")])
        yield rls
    finally:
        stop_process(proc, 10)


CURL_FAILS_ON_HTTP_ERRORS = 'curl() { command curl --fail-with-body --max-time 10 "$@"; }\n'


def _localised(command: str, rls: RlsProcess) -> str:
    for documented_addr, real in (("localhost:8080", f"127.0.0.1:{rls.http_port}"),
                                  ("127.0.0.1:8080", f"127.0.0.1:{rls.http_port}"),
                                  ("127.0.0.1:8081", f"127.0.0.1:{rls.grpc_port}")):
        command = command.replace(documented_addr, real)
    return command


@pytest.mark.parametrize(("where", "command", "output"), TO_RUN,
                         ids=[f"{w} {c.splitlines()[0][:60]}" for w, c, _ in TO_RUN])
def test_documented_command_runs(
    where: str, command: str, output: str, docs_rls: RlsProcess
) -> None:
    env = clean_env(RLS_ADMIN_TOKEN=TOKEN, RLS_ADMIN_URL=docs_rls.http_url)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if command.startswith("rls serve "):  # its own ports: the documented ones may be taken
        command = command.replace(
            "rls serve ", f"rls serve --grpc-addr 127.0.0.1:{free_port()} "
            f"--http-addr 127.0.0.1:{free_port()} --extproc-addr 127.0.0.1:{free_port()} ", 1)
    script = CURL_FAILS_ON_HTTP_ERRORS + _localised(command, docs_rls)
    if RUNS_UNTIL_STOPPED.match(command):
        proc = subprocess.Popen(["bash", "-c", script], cwd=str(ROOT), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:  # a bad flag or an unreachable admin API ends it within this time
            out, err = proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=10)
            return  # still running after 3 s: it started

        assert proc.returncode == 0, f"{where}: {command}\n{out!r}\n{err!r}"
        return
    done = subprocess.run(["bash", "-c", "set -o pipefail\n" + script], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=60)
    error = documented_error(output)
    if error is not None:  # documented as refused: refused, with the documented message
        assert done.returncode == 22 and error in done.stdout, (
            f"{where}: {command}\nexit {done.returncode}\n{done.stdout[-2000:]}")
        return
    assert done.returncode == 0, (
        f"{where}: {command}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    check_same_shape(where, output, done.stdout)


def _shape(value: object) -> object:
    """The keys of a JSON answer, and of the first item of each list of objects in it."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if isinstance(v, (dict, list))} | {
            k: None for k, v in value.items() if not isinstance(v, (dict, list))}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [_shape(value[0])]
    return None


def check_same_shape(where: str, documented: str, actual: str) -> None:
    """A documented JSON answer has the fields of the real one, at every level (values differ:
    times, counts); a list of objects is compared by its first item."""
    try:
        shown = json.loads(documented)
    except ValueError:
        return  # not a JSON answer (text, a table)
    assert isinstance(shown, dict), documented
    real = json.loads(actual)
    assert _shape(shown) == _shape(real), f"{where}:\n{_shape(shown)}\n{_shape(real)}"
