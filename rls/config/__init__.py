"""Descriptor config: YAML schema and validation, loading, matching, and reload."""

from rls.config.errors import ConfigError
from rls.config.loader import load_paths
from rls.config.model import Limit, RateLimitConfig, Unit

__all__ = ["ConfigError", "Limit", "RateLimitConfig", "Unit", "load_paths"]
