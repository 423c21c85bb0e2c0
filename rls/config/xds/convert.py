"""xDS resources -> the file loader's documents -> one RateLimitConfig.

Like the reference (config_xds.go), each `RateLimitConfig` resource becomes exactly the
document a YAML descriptor file would parse to, and the whole set is built and validated by
the same code as files (rls.config.loader.load_documents): the same rules, the same messages,
with the resource's `name` where a file error has the file's path and the node path starting
with the domain (`basic: invalid rate limit unit 'UNKNOWN' (node basic.key1; valid units: …)`).

Everything here may be handed a hostile control plane's response, so it is bounded: the
number of resources, the bytes of each, the nesting (checked while converting, before the
loader's own MAX_DEPTH check could be reached by recursion) and the load's time budget.
Runs in a worker thread (rls.config.reload.in_daemon_thread), never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from rls.config.errors import ConfigError
from rls.config.loader import MAX_DEPTH, LoadBudget, load_documents
from rls.config.model import RateLimitConfig
from rls.config.xds.proto import rls_conf_pb2 as _generated

pb: Any = _generated  # generated module: no type information

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
MAX_RESOURCES = 50_000  # LoadBudget.max_files: one resource is one file
RESPONSE = "(response)"  # the "file" of an error about the response as a whole


class XdsResponseError(ConfigError):
    """A response refused before its documents reach the loader; `reason` is its
    rls_xds_nacks_total label (type_url, decode, too_large, timeout)."""

    def __init__(self, file: str, message: str, reason: str) -> None:
        super().__init__(file, message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class YieldingBudget(LoadBudget):
    """The loader's budget, and at every document a yield of the GIL (time.sleep(0)): a
    CPU-bound build in a worker thread otherwise keeps the event loop waiting for the GIL on
    each of its wake-ups, and decisions queue behind it (measured on 10,000 domains: the
    loop's median wait from 3-6 ms to 0.2 ms, at the price of a somewhat longer build)."""

    def check_time(self, file: str) -> None:
        LoadBudget.check_time(self, file)
        time.sleep(0)


def policy_doc(policy: Any) -> dict[str, Any]:
    """`rate_limit:` of a descriptor, every field as the reference writes it."""
    return {
        "unit": pb.RateLimitUnit.Name(policy.unit)
        if policy.unit in pb.RateLimitUnit.values()
        else str(policy.unit),
        "requests_per_unit": policy.requests_per_unit,
        "unlimited": policy.unlimited,
        "name": policy.name,
        "replaces": [{"name": r.name} for r in policy.replaces],
    }


def descriptors_doc(name: str, items: Sequence[Any], depth: int) -> list[dict[str, Any]]:
    """`descriptors:` of a level; deeper than MAX_DEPTH is the loader's error, raised here."""
    if items and depth > MAX_DEPTH:
        raise ConfigError(name, f"config error, descriptors nested deeper than {MAX_DEPTH}")
    out = []
    for item in items:
        doc: dict[str, Any] = {
            "key": item.key,
            "value": item.value,
            "shadow_mode": item.shadow_mode,
            "detailed_metric": item.detailed_metric,
            "quota_mode": item.quota_mode,
        }
        if item.HasField("rate_limit"):
            doc["rate_limit"] = policy_doc(item.rate_limit)
        if item.descriptors:
            doc["descriptors"] = descriptors_doc(name, item.descriptors, depth + 1)
        if item.HasField("metadata"):
            doc["metadata"] = json_format.MessageToDict(item.metadata)
        out.append(doc)
    return out


def resource_doc(resource: Any, name: str = "") -> dict[str, Any]:
    """The YAML-shaped document of one RateLimitConfig resource (`name` labels errors)."""
    return {
        "domain": resource.domain,
        "descriptors": descriptors_doc(name or resource.name, resource.descriptors, 1),
    }


def unpack(index: int, any_msg: Any, max_bytes: int) -> Any:
    """The RateLimitConfig inside one Any, or ConfigError naming its place in the response."""
    where = f"resource[{index}]"
    if any_msg.type_url != TYPE_URL:
        raise XdsResponseError(
            where, f"unexpected type_url '{any_msg.type_url[:200]}', expected '{TYPE_URL}'",
            "type_url",
        )
    if len(any_msg.value) > max_bytes:
        raise XdsResponseError(
            where, f"{len(any_msg.value)} bytes, over the {max_bytes}-byte limit per resource",
            "too_large",
        )
    resource = pb.RateLimitConfig()
    try:
        resource.ParseFromString(any_msg.value)
    except (DecodeError, RecursionError) as exc:
        raise XdsResponseError(
            where, f"cannot decode RateLimitConfig: {exc}", "decode"
        ) from None
    return resource


def build_config(
    resources: Sequence[Any], merge_domains: bool = False, budget: LoadBudget | None = None
) -> RateLimitConfig:
    """One config from a response's whole set of resources (Any-packed), or ConfigError.

    Names must be unique (they stand where file paths stand); a domain given by two resources
    is the loader's `duplicate domain` error unless domains may merge (MERGE_DOMAIN_CONFIG).
    """
    budget = budget or LoadBudget()
    if len(resources) > MAX_RESOURCES:
        raise XdsResponseError(
            RESPONSE, f"{len(resources)} resources, over the limit {MAX_RESOURCES}", "too_large"
        )
    docs: list[tuple[str, dict[str, Any]]] = []
    names: set[str] = set()
    total = 0
    for index, any_msg in enumerate(resources):
        budget.check_time(RESPONSE)
        total += len(any_msg.value)
        if total > budget.max_total_bytes:
            raise XdsResponseError(
                RESPONSE, f"resources total over the {budget.max_total_bytes}-byte limit",
                "too_large",
            )
        resource = unpack(index, any_msg, budget.max_file_bytes)
        name = resource.name or f"resource[{index}]"
        if name in names:
            raise ConfigError(name, f"duplicate resource name '{name}'")
        names.add(name)
        try:
            docs.append((name, resource_doc(resource, name)))
        except RecursionError:
            raise ConfigError(name, "config error, nesting too deep") from None
    return load_documents(docs, merge_domains, budget)
