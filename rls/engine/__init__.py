"""Backend-agnostic decisions: keys, algorithms, the admission rule, and the limiter."""
