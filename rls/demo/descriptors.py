"""The descriptor files `rls serve` gets in the demo: config/'s, or quota mode's own domain.

Quota mode replaces the `gateway-rlqs` domain of config/ with QUOTA_DESCRIPTORS, whose small
per-minute limit the smoke check and the banner count on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rls.demo.errors import DemoError

# Quota mode (--quota): the descriptors of domain gateway-rlqs, written next to the logs.
QUOTA_LIMIT = 10
QUOTA_DESCRIPTORS = f"""\
domain: gateway-rlqs
descriptors:
  - key: x-client-id          # bucket {{name: per-client, x-client-id: <header>}}
    rate_limit: {{unit: minute, requests_per_unit: {QUOTA_LIMIT}}}
  - key: name
    value: anonymous          # requests without x-client-id share one bucket
    rate_limit: {{unit: minute, requests_per_unit: 100}}
"""


def descriptor_files(config_dir: Path) -> list[Path]:
    """Descriptor files of a config directory: YAML maps with a `domain` (cache rules have
    none and are skipped — they belong to `--cache-config`)."""
    if not config_dir.is_dir():
        raise DemoError(f"config directory {config_dir} not found (pass --config DIR)")
    found = []
    for path in sorted(config_dir.iterdir()):
        if path.name.startswith(".") or path.suffix not in (".yaml", ".yml"):
            continue
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # rls would report it; the demo just leaves it out
        if isinstance(doc, dict) and doc.get("domain"):
            found.append(path)
    if not found:
        raise DemoError(f"no descriptor files (YAML with a `domain`) in {config_dir}")
    return found


def with_quota_descriptors(files: list[Path], workdir: Path) -> list[Path]:
    """`files` without any that defines gateway-rlqs, plus QUOTA_DESCRIPTORS written to
    `workdir` (two files of one domain would not load)."""
    quota_file = workdir / "quota-descriptors.yaml"
    quota_file.write_text(QUOTA_DESCRIPTORS)
    files = [f for f in files if "gateway-rlqs" not in f.read_text(errors="replace")]
    files.append(quota_file)
    return files
