"""Config from a control plane over xDS (State of the World, ADS), as envoyproxy/ratelimit's
CONFIG_TYPE=GRPC_XDS_SOTW: convert.py turns resources into the file loader's documents,
client.py holds the stream."""
