"""Third-party code carried as is (see otlp_proto/__init__.py)."""
