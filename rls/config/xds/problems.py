"""Why the control plane cannot be reached, said in terms of the settings that fix it.

gRPC reports a failed connection as one string for every cause (`failed to connect to all
addresses; last error: …`) whose tail is grpc-core's or BoringSSL's own words (`Hostname
Verification Check failed`, `Socket closed`, `WRONG_VERSION_NUMBER`). `classify` reads that
tail — the one place that knows grpc's wording — and `explain` turns the class into a sentence
naming what is wrong and which variable to change. Anything not recognised is passed on as
gRPC said it.
"""

from __future__ import annotations

import dataclasses
import re

from rls.settings import Settings
from rls.settings.environment import REFERENCE_ENV, env_source

# The classes of a connection failure, from grpc's debug string (classify).
WRONG_NAME = "wrong_name"  # the certificate does not carry the expected name
UNTRUSTED = "untrusted"  # the certificate does not verify against the CA
PLAINTEXT_SERVER = "plaintext_server"  # we speak TLS, the control plane plaintext
CLOSED_IN_HANDSHAKE = "closed_in_handshake"  # the peer hung up before any HTTP/2
REFUSED = "refused"  # nothing listens there
UNRESOLVED = "unresolved"  # the host name does not resolve

_VERIFY_REASON = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings)}


def classify(text: str) -> str | None:
    """The class of a failed connection from gRPC's details (or debug_error_string()); None
    when the text says none of the known causes."""
    if "Hostname Verification Check failed" in text:
        return WRONG_NAME
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return UNTRUSTED
    if "WRONG_VERSION_NUMBER" in text:
        return PLAINTEXT_SERVER
    if "Socket closed" in text:
        return CLOSED_IN_HANDSHAKE
    if "Connection refused" in text:
        return REFUSED
    if "errors resolving" in text or "DNS resolution failed" in text:
        return UNRESOLVED
    return None


def setting(settings: Settings, name: str) -> str:
    """How the user gave setting `name`: the variable that holds it; else the flag, when the
    value is not the default (only the flag can have set it); else the reference's variable
    (the name Envoy Gateway and the docs use)."""
    found = env_source(name)
    if found is not None:
        return found[0]
    if getattr(settings, name) != _DEFAULTS[name]:
        return "--" + name.replace("_", "-")
    return REFERENCE_ENV[name]


def explain(settings: Settings, kind: str, text: str) -> str:
    """What is wrong and what to change, for a failure of class `kind` (classify); `text` is
    gRPC's details, from which the CA's verdict is quoted."""
    url = settings.xds_server_url
    url_var = setting(settings, "xds_server_url")
    if kind == WRONG_NAME:
        san, san_var = settings.xds_server_tls_san, setting(settings, "xds_server_tls_san")
        expected = (f"'{san}' ({san_var})" if san
                    else f"'{url.rpartition(':')[0]}' (the host of {url_var})")
        return (f"the control plane's certificate does not carry the name {expected}: set "
                f"{san_var} to a DNS name (or IP) in that certificate's subjectAltName")
    if kind == UNTRUSTED:
        verdict = _VERIFY_REASON.search(text)
        cacert = settings.xds_server_tls_cacert
        roots = (f"the CA in {cacert} ({setting(settings, 'xds_server_tls_cacert')})" if cacert
                 else "the system's CAs (" + REFERENCE_ENV["xds_server_tls_cacert"] + " unset)")
        return (f"the control plane's certificate does not verify against {roots}"
                + (f": {verdict.group(1).strip()}" if verdict else "")
                + "; give the CA that signed the control plane's certificate")
    if kind == PLAINTEXT_SERVER:
        return (f"the control plane at {url} speaks plaintext, not TLS: unset "
                f"{setting(settings, 'xds_server_use_tls')} or serve TLS there")
    if kind == CLOSED_IN_HANDSHAKE:
        return _closed(settings)
    if kind == REFUSED:
        return f"nothing accepts connections at {url} ({url_var})"
    if kind == UNRESOLVED:
        return f"the host of {url} ({url_var}) does not resolve"
    return text


def _closed(settings: Settings) -> str:
    """The peer closed the connection before HTTP/2 started: with TLS, it refused us in the
    handshake (a client certificate missing or not from its CA); without, it wants TLS."""
    if not settings.xds_server_use_tls:
        return ("the control plane closed the connection at once: it probably expects TLS: "
                f"set {REFERENCE_ENV['xds_server_use_tls']}=true (with "
                f"{REFERENCE_ENV['xds_server_tls_cacert']}, and "
                f"{REFERENCE_ENV['xds_client_tls_cert']} / _KEY if it asks for a client "
                "certificate)")
    cert, key = settings.xds_client_tls_cert, settings.xds_client_tls_key
    if not cert:
        return ("the control plane closed the connection in the TLS handshake: it probably "
                "requires a client certificate: set "
                f"{setting(settings, 'xds_client_tls_cert')} / "
                f"{setting(settings, 'xds_client_tls_key')}")
    return (f"the control plane refused our client certificate {cert}: check "
            f"{setting(settings, 'xds_client_tls_cert')} / "
            f"{setting(settings, 'xds_client_tls_key')} ({key}) and that its CA is the one "
            "the control plane trusts")


def unreadable(settings: Settings, name: str, error: OSError) -> str:
    """A TLS file of setting `name` that cannot be read."""
    what = {"xds_client_tls_cert": "client certificate", "xds_client_tls_key": "client key",
            "xds_server_tls_cacert": "CA"}[name]
    return (f"cannot read the {what} {getattr(settings, name)} ({setting(settings, name)}): "
            f"{error.strerror or error}")
