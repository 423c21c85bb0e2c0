"""AUTH and ACL: `redis://:password@` (requirepass) and `redis://user:password@` (ACL user) work;
a wrong password fails fast with the failure mode, is counted in rls_backend_errors_total, and no
password ever reaches rls's log."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import http_get, wait_until

from rls.stores.redis.connect import redact

from .conftest import ACL_PASSWORD, ACL_USER, DEFAULT_PASSWORD
from .rlsclient import (
    OK,
    OVER,
    SLACK_S,
    TIMEOUT_MS,
    Client,
    backend_errors,
    desc,
    start_rls,
    used,
    write_config,
)
from .servers import AuthSetup

pytestmark = pytest.mark.redis

DOMAIN = "auth"
CONFIG = """
domain: auth
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 3}
"""
WRONG_PASSWORD = "wrong-Pa55-91d3"
SECRETS = (DEFAULT_PASSWORD, ACL_PASSWORD, quote(ACL_PASSWORD, safe=""), WRONG_PASSWORD)


def assert_no_secret(log: str) -> None:
    for secret in SECRETS:
        assert secret not in log, f"secret {secret!r} appears in rls's log:\n{log}"


@pytest.mark.parametrize("who", ["requirepass", "acl_user"])
def test_password_urls_work(who: str, auth_redis: AuthSetup, rls_factory, tmp_path: Path):
    port = auth_redis.proc.port
    if who == "requirepass":
        url = f"redis://:{DEFAULT_PASSWORD}@127.0.0.1:{port}/0"
    else:  # the password has '@' and ':' and is percent-encoded, as a URL requires
        url = f"redis://{ACL_USER}:{quote(ACL_PASSWORD, safe='')}@127.0.0.1:{port}/0"
    server = auth_redis.proc.client()
    server.flushall()
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, "--log-level", "debug")
    client = Client(rls.grpc_addr, DOMAIN)
    try:
        for remaining in (2, 1, 0):
            a = client.call(desc(("k", who)))
            assert a.decided and a.code == OK and a.resp.statuses[0].limit_remaining == remaining
        a = client.call(desc(("k", who)))
        assert a.decided and a.code == OVER, a.resp
    finally:
        client.close()
    assert used(rls.http_url, DOMAIN, ("k", who)) == [3]
    assert backend_errors(rls.http_url) == 0
    # rls's connections are authenticated as the intended user.
    users = {c.get("user") for c in server.client_list() if c.get("id") != str(server.client_id())}
    assert users == {"default" if who == "requirepass" else ACL_USER}, users
    assert_no_secret(rls.log())


@pytest.mark.parametrize(("who", "mode"), [("requirepass", "allow"), ("acl_user", "deny")])
def test_wrong_password_is_not_ready_says_why_and_fails_fast(
    who: str, mode: str, auth_redis: AuthSetup, rls_factory, tmp_path: Path
):
    port = auth_redis.proc.port
    user = "" if who == "requirepass" else ACL_USER
    url = f"redis://{user}:{WRONG_PASSWORD}@127.0.0.1:{port}/0"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url,
                    "--failure-mode", mode, "--log-level", "debug", ready=False)
    wait_until(lambda: "redis refuses rls" in rls.log(), timeout=10,
               what="the refusal logged with its reason")
    status, body = http_get(rls.http_url + "/healthcheck")
    assert status == 500, (status, body)  # never ready while the store rejects us
    expected = OK if mode == "allow" else OVER
    client = Client(rls.grpc_addr, DOMAIN)
    try:
        answers = [client.call(desc(("k", "wrong"))) for _ in range(5)]
    finally:
        client.close()
    for a in answers:
        assert a.code == expected and not a.decided, a.resp
        assert a.seconds <= TIMEOUT_MS / 1000 + SLACK_S, f"answer took {a.seconds:.3f}s"
    assert backend_errors(rls.http_url) >= 5
    wait_until(lambda: "backend redis failed" in rls.log(), timeout=5,
               what="the backend failure logged")
    log = rls.log()
    assert "invalid username-password pair" in log, log
    assert "Redis refuses the user or password (invalid username-password pair or user is " \
        "disabled): fix them in --redis-url / RLS_REDIS_URL" in log, log
    assert_no_secret(log)


def test_missing_password_is_one_line_naming_the_setting(
    auth_redis: AuthSetup, rls_factory, tmp_path: Path
):
    url = f"redis://127.0.0.1:{auth_redis.proc.port}/0"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, ready=False)
    wait_until(lambda: "redis refuses rls" in rls.log(), timeout=10,
               what="the refusal logged with its reason")
    lines = [line for line in rls.log().splitlines() if "ERROR" in line]
    assert len(lines) == 1, rls.log()
    assert "Redis needs a password and none was given: set it in --redis-url / " \
        "RLS_REDIS_URL" in lines[0], lines
    assert "HELLO" not in rls.log()


@pytest.mark.parametrize("url", [
    "redis://:pw-1@h:1/0",
    "redis://app:pw-1@h:1/0",
    "rediss://app:pw-1@h:1/0?ssl_cert_reqs=none",
    "redis+sentinel://:pw-1@h1:1,h2:2/mymaster/0",
    "redis+cluster://app:pw-1@h1:1,h2:2",
])
def test_redact_hides_the_password(url: str):
    shown = redact(url)
    assert "pw-1" not in shown and "***" in shown, shown
    assert shown.replace(":***@", "@").split("@", 1)[1] == url.split("@", 1)[1], shown


def test_acl_user_without_script_rights_is_not_ready_and_says_why(
    auth_redis: AuthSetup, rls_factory, tmp_path: Path
):
    """The user logs in, but its ACL forbids EVALSHA: rls is never ready and logs NOPERM
    instead of answering every call by the failure mode while looking healthy."""
    admin = auth_redis.proc.client()
    admin.execute_command("ACL", "SETUSER", "noscript", "on", ">noscript-pw", "~*",
                          "+@all", "-@scripting")
    url = f"redis://noscript:noscript-pw@127.0.0.1:{auth_redis.proc.port}/0"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, ready=False)
    wait_until(lambda: "redis refuses rls" in rls.log(), timeout=10,
               what="the ACL refusal logged")
    assert http_get(rls.http_url + "/healthcheck")[0] == 500
    assert "no permissions" in rls.log() or "NOPERM" in rls.log(), rls.log()
