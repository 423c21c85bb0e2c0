"""Admin HTTP API: metrics, health, config dump, decisions as JSON."""
