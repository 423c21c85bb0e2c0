"""The shipped Envoy configs' commented mTLS blocks, turned on for a test: uncommented as a user
would, with the certificate paths pointed at the test's files."""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = "/etc/envoy/rls-tls/"  # where the blocks in envoy/ read Envoy's files
HELM_DIR = "/etc/envoy-rls-tls/"  # where the Helm chart's sidecar reads them
BLOCK_START = "# transport_socket:"


def enable_mtls(text: str, cert_dir: Path, shipped_dir: str = SHIPPED_DIR) -> str:
    """`text` with every commented `transport_socket` block uncommented (the `# ` after the
    indentation removed) and the shipped certificate directory replaced by `cert_dir`."""
    out: list[str] = []
    indent: int | None = None
    found = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip(" ")
        here = len(line) - len(stripped)
        if stripped.startswith(BLOCK_START):
            indent, found = here, found + 1
        elif indent is not None and not (here == indent and stripped.startswith("#   ")):
            indent = None
        if indent is not None:
            line = line[:indent] + stripped[2:]
        out.append(line)
    assert found, "no commented transport_socket block in the config"
    return "".join(out).replace(shipped_dir, f"{cert_dir}/")
