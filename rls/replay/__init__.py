"""Decide a traffic log against a config with the in-process engine, offline (`rls replay`).

reader.py streams the log (an Envoy JSON access log with rls's dynamic metadata, or rls's own
`--decision-log`), engines.py decides each request on the log's own timestamps (the memory
store, or a fast path for plain fixed windows checked against it), report.py tallies who would
be limited, when and by which limit (and what changes against a baseline config), run.py is one
replay from the files to the report. The command line is rls.cli.replay.
"""
