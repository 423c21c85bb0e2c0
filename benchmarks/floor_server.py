"""The floor: an empty grpc.aio ShouldRateLimit handler returning a fixed serialized response.

Same server shape as `rls serve` (grpc.aio, a generic handler taking and returning raw bytes,
the same server options), but no parsing, matching, counting or metrics. rls_throughput.py
divides rls's throughput by this one's, measured in the same run on the same machine.

    python benchmarks/floor_server.py --port 50051 [--loop uvloop|asyncio] [--busy-us 15]

It runs on the event loop rls runs on (`--loop`, default uvloop where installed, as rls):
a floor on another loop would credit or charge rls with the loop's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"


def fixed_response() -> bytes:
    """What rls answers for the 3-descriptor benchmark request: OK, 3 statuses with limits."""
    resp = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)
    for name in ("", "items_per_user", ""):
        st = resp.statuses.add(code=rls_pb2.RateLimitResponse.OK, limit_remaining=999_999_990)
        st.current_limit.requests_per_unit = 1_000_000_000
        st.current_limit.unit = rls_pb2.RateLimitResponse.RateLimit.MINUTE
        if name:
            st.current_limit.name = name
        st.duration_until_reset.seconds = 42
    return resp.SerializeToString()


RESPONSE = fixed_response()


BUSY_S = 0.0  # --busy-us: CPU burnt per call (a calibration: what a handler's work costs)


async def should_rate_limit(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if BUSY_S:
        until = time.perf_counter() + BUSY_S
        while time.perf_counter() < until:
            pass
    return RESPONSE


async def main(addr: str) -> None:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 64 * 1024), ("grpc.so_reuseport", 1)]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE,
        {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(should_rate_limit)},
    ),))
    if server.add_insecure_port(addr) == 0:
        raise SystemExit(f"cannot listen on {addr}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"floor server on {addr}", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="burn this much CPU per call before answering (calibration)")
    args = parser.parse_args()
    BUSY_S = args.busy_us / 1e6
    from rls.event_loop import loop_factory, loop_name

    print(f"loop: {loop_name(args.loop)}", flush=True)
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        runner.run(main(f"{args.host}:{args.port}"))
