"""Envoy, for the test that validates the chart's sidecar block: the end-to-end suite's fixture."""

from e2e import conftest as e2e_fixtures

envoy_binary = e2e_fixtures.envoy_binary
