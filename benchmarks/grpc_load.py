"""A gRPC unary load generator on grpc.aio, for what h2load cannot do: present a client
certificate (mTLS). Sends one pre-serialized request N times over C channels with M calls in
flight on each (closed loop), and prints one JSON line: total, ok, errors, elapsed_s, rps.

    python benchmarks/grpc_load.py 127.0.0.1:8081 request.bin -n 20000 -c 4 -m 32 \\
        --ca ca.crt --cert client.crt --key client.key --sni localhost

Written in Python, it costs the client far more CPU per call than h2load: compare server CPU
per call between variants run with this same generator, never with h2load's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import grpc

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    if not args.ca:
        return None
    key = Path(args.key).read_bytes() if args.key else None
    cert = Path(args.cert).read_bytes() if args.cert else None
    return grpc.ssl_channel_credentials(Path(args.ca).read_bytes(), key, cert)


async def run(args: argparse.Namespace) -> dict[str, float]:
    body = Path(args.body).read_bytes()
    creds = credentials(args)
    options = [("grpc.ssl_target_name_override", args.sni)] if creds and args.sni else []
    # One connection per channel: grpc would otherwise share a subchannel between them.
    options.append(("grpc.use_local_subchannel_pool", 1))
    channels = [grpc.aio.secure_channel(args.addr, creds, options) if creds
                else grpc.aio.insecure_channel(args.addr, options) for _ in range(args.clients)]
    left = args.requests
    ok = errors = 0

    async def worker(channel: grpc.aio.Channel) -> None:
        nonlocal left, ok, errors
        call = channel.unary_unary(METHOD)
        while left > 0:
            left -= 1
            try:
                await call(body, timeout=10)
                ok += 1
            except grpc.aio.AioRpcError:
                errors += 1

    for channel in channels:
        await channel.channel_ready()
    start = time.perf_counter()
    await asyncio.gather(*(worker(ch) for ch in channels for _ in range(args.streams)))
    elapsed = time.perf_counter() - start
    for channel in channels:
        await channel.close()
    return {"total": ok + errors, "ok": ok, "errors": errors, "elapsed_s": round(elapsed, 3),
            "rps": round((ok + errors) / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("addr")
    parser.add_argument("body", help="the serialized RateLimitRequest (not a gRPC frame)")
    parser.add_argument("-n", "--requests", type=int, default=20_000)
    parser.add_argument("-c", "--clients", type=int, default=4, help="channels (connections)")
    parser.add_argument("-m", "--streams", type=int, default=32, help="calls in flight each")
    parser.add_argument("--ca", help="trust this CA (TLS); none: plaintext")
    parser.add_argument("--cert", help="client certificate (mTLS)")
    parser.add_argument("--key", help="its private key")
    parser.add_argument("--sni", default="", help="the server name to check")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
