"""Redis CPU per decision by queue depth: one EVALSHA per request, one batch EVALSHA per loop
turn, and envoyproxy/ratelimit's INCRBY+EXPIRE, all offered the same rate.

What the lean connection sends when a loop turn holds `depth` decisions (rls/stores/redis/wire.py):
- `single`: `depth` EVALSHAs of lua/decide_fixed_window.lua in one write;
- `batch`: one EVALSHA of lua/decide_fixed_window_batch.lua carrying the `depth` requests (each
  still all-or-nothing);
- `incrby`: the reference's scheme, per decision INCRBY + EXPIRE, `depth` of them in one write.
Every variant is paced to the same decisions per second (`--rate`), because Redis's CPU per
command depends on how often it wakes up; rounds alternate the variants. Measured: the whole
server's CPU (INFO cpu, user + sys) per decision, median over rounds, and its ratio to
`incrby` at the same depth. 1-descriptor requests over 100 users (keys exist, never full).

    python benchmarks/redis_batch.py [--rate 8000] [--seconds 2] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable

import hiredis
from _common import median, start_redis, table, workdir, write_results

from rls.stores.redis.scripts import lean_batch_script, lean_script

DEPTHS = (1, 2, 4, 8, 16, 32)
USERS = 100
HIGH = 1_000_000_000
TTL_MS = 60_000


class Conn:
    """A blocking RESP connection: one write of many commands, then every reply."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def run(self, payload: bytes, replies: int) -> list[object]:
        self.sock.sendall(payload)
        out: list[object] = []
        while len(out) < replies:
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(1 << 16))
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(str(reply))
            out.append(reply)
        return out

    def command(self, *args: object) -> object:
        return self.run(hiredis.pack_command(args), 1)[0]  # type: ignore[arg-type]


def server_cpu(conn: Conn) -> float:
    text = conn.command("INFO", "cpu")
    info = dict(
        line.split(":", 1) for line in text.decode().splitlines()  # type: ignore[union-attr]
        if ":" in line
    )
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def payloads(depth: int, lean_sha: str, batch_sha: str) -> dict[str, Callable[[int], bytes]]:
    def key(i: int) -> str:
        return f"rl:bench:user_u{i % USERS}@1"

    room = str(HIGH - 1)

    def single(start: int) -> bytes:
        return b"".join(
            hiredis.pack_command(("EVALSHA", lean_sha, 1, key(start + j), "d", room, "1",
                                  str(TTL_MS)))
            for j in range(depth)
        )

    def batch(start: int) -> bytes:
        keys = [key(start + j) for j in range(depth)]
        args: list[str] = [str(depth), *("1" for _ in range(depth))]
        for _ in range(depth):
            args += ["d", room, "1", str(TTL_MS)]
        return hiredis.pack_command(("EVALSHA", batch_sha, depth, *keys, *args))

    def incrby(start: int) -> bytes:
        return b"".join(
            hiredis.pack_command(("INCRBY", key(start + j), 1))
            + hiredis.pack_command(("EXPIRE", key(start + j), 60))
            for j in range(depth)
        )

    return {"single": single, "batch": batch, "incrby": incrby}


REPLIES = {"single": lambda d: d, "batch": lambda d: 1, "incrby": lambda d: 2 * d}


def run(conn: Conn, make: Callable[[int], bytes], replies: int, depth: int, rate: float,
        seconds: float) -> float:
    """Paced: one write of `depth` decisions every depth/rate seconds; Redis CPU µs/decision."""
    writes = max(1, int(rate * seconds / depth))
    interval = depth / rate
    cpu0 = server_cpu(conn)
    start = time.perf_counter()
    for w in range(writes):
        conn.run(make(w * depth), replies)
        pause = start + (w + 1) * interval - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return (server_cpu(conn) - cpu0) * 1e6 / (writes * depth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=8000.0, help="decisions per second")
    parser.add_argument("--seconds", type=float, default=2.0, help="per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 0.5, 1
    d = workdir("redis_batch")
    redis = start_redis(d)
    conn = Conn(redis.port)
    lean_sha = str(conn.command("SCRIPT", "LOAD", lean_script()), "ascii")  # type: ignore[arg-type]
    batch_sha = str(conn.command("SCRIPT", "LOAD", lean_batch_script()), "ascii")  # type: ignore[arg-type]
    rows = []
    results = []
    try:
        for depth in DEPTHS:
            makers = payloads(depth, lean_sha, batch_sha)
            for name, make in makers.items():  # warm: every key exists
                conn.run(make(0), REPLIES[name](depth))
            cpu: dict[str, list[float]] = {name: [] for name in makers}
            for r in range(args.rounds):
                names = list(makers)
                names = names[r % 3:] + names[: r % 3]
                for name in names:
                    cpu[name].append(run(conn, makers[name], REPLIES[name](depth), depth,
                                         args.rate, args.seconds))
            ref = median(cpu["incrby"])
            entry = {"depth": depth, **{f"{n}_us": round(median(v), 2) for n, v in cpu.items()},
                     "single_x_incrby": round(median(cpu["single"]) / ref, 2),
                     "batch_x_incrby": round(median(cpu["batch"]) / ref, 2)}
            results.append(entry)
            rows.append([depth, entry["single_us"], entry["batch_us"], entry["incrby_us"],
                         entry["single_x_incrby"], entry["batch_x_incrby"]])
            print(rows[-1], flush=True)
    finally:
        redis.stop()
    text = table(["depth", "single µs", "batch µs", "INCRBY+EXPIRE µs", "single x ref",
                  "batch x ref"], rows,
                 f"Redis CPU per decision at {args.rate:g} decisions/s, by queue depth")
    write_results("redis_batch", {"params": vars(args), "results": results}, args.quick, [text])


if __name__ == "__main__":
    main()
