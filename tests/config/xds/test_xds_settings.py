"""The reference's xDS variables set rls's settings (Envoy Gateway's environment as is)."""

from __future__ import annotations

import pytest

from rls.cli import serve
from rls.cli.main import parser
from rls.settings import Settings
from rls.settings.forms import stream_headers

ENVOY_GATEWAY = {
    "CONFIG_TYPE": "GRPC_XDS_SOTW",
    "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
    "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
    "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "1m30s",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "8388608",
}


def settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return serve.settings_from(parser().parse_args(["serve", *args]))


def test_envoy_gateway_environment_sets_the_xds_client(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(monkeypatch, ENVOY_GATEWAY)
    assert settings.config_type == "GRPC_XDS_SOTW"
    assert settings.xds_server_url.endswith(":18001") and settings.xds_node_id == "envoy-ratelimit"
    assert settings.xds_server_use_tls and settings.xds_client_tls_key == "/certs/tls.key"
    assert settings.force_start_without_initial_config
    assert settings.xds_backoff_initial == 90.0 and settings.xds_backoff_max == 60.0
    assert settings.xds_max_msg_bytes == 8 << 20 and settings.xds_connect_retry_interval == 3.0


def test_rls_names_and_flags_win_over_the_reference_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**ENVOY_GATEWAY, "RLS_XDS_NODE_ID": "from-rls-env"}
    settings = settings_from(monkeypatch, env, "--xds-backoff-max", "2m")
    assert settings.xds_node_id == "from-rls-env" and settings.xds_backoff_max == 120.0


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"CONFIG_TYPE": "XDS"}, (), "CONFIG_TYPE: 'XDS' is not one of FILE, GRPC_XDS_SOTW"),
    ({"CONFIG_TYPE": "GRPC_XDS_SOTW"}, ("--config", "/etc/rls"),
     "--config (RLS_CONFIG) cannot be given beside it"),
    ({"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "novalue"}, (),
     "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: entry 'novalue' is not key:value"),
    ({"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x tenant:t1"}, (),
     "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: header name 'x tenant' is not a gRPC "
     "metadata key"),
    ({"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-tenant:caf\u00e9"}, (),
     "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: the value of 'x-tenant' is not printable "
     "ASCII"),
    ({"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "soon"}, (),
     "XDS_CLIENT_BACKOFF_MAX_INTERVAL: 'soon' is not a duration"),
    ({"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/c.crt"}, (),
     "a client certificate needs both the certificate and its key"),
])
def test_bad_xds_settings_name_their_source(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        settings_from(monkeypatch, env, *args)
    assert message in str(caught.value)


def test_additional_headers_become_stream_metadata_as_the_reference_sends_them() -> None:
    """Keys lower-cased; gRPC's reserved names left out (grpc-go, the reference's client,
    skips them: `grpc-timeout` would otherwise end every stream); `-bin` values as bytes
    (gRPC base64-encodes them on the wire, as grpc-go does)."""
    headers, dropped = stream_headers(
        "X-Tenant:t1,grpc-timeout:1S,Content-Type:text/plain,te:trailers,x-token-bin:ab:c"
    )
    assert headers == (("x-tenant", "t1"), ("x-token-bin", b"ab:c"))
    assert dropped == ["grpc-timeout", "content-type", "te"]
