"""Algorithm tests: reference models, differential replays, properties, multi-process."""
