"""The OTLP modules that `xds-protos` overwrites, as `opentelemetry-proto` 1.45.2 ships them.

`xds-protos` (rls's Envoy API dependency) bundles a copy of the OpenTelemetry protos from
2021 (opentelemetry-proto v0.9: `InstrumentationLibrary`, no `InstrumentationScope`) under
the same file names as the `opentelemetry-proto` package. pip installs xds-protos after
opentelemetry-proto (its dependency graph is one level deeper), so in every fresh install
the old files win and the OTLP exporters fail to import (grpc/grpc#42926,
open-telemetry/opentelemetry-python#4843). These eight files are the generated modules of
`opentelemetry-proto` 1.45.2 (Apache-2.0), byte for byte, for exactly the eight files that
xds-protos replaces; `rls.tracing.otlp_compat` loads them under their own names only when
the installed ones are the old copy. Nothing imports this package directly.
"""
