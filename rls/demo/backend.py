"""The demo's upstream: a tiny HTTP server per endpoint of the Envoy config's `backend` cluster.

It runs in this process (threads) and echoes what it saw as JSON, so a reply shows which
client Envoy forwarded and how many body bytes got through.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def start_backend(port: int) -> ThreadingHTTPServer:
    """A tiny upstream answering JSON: what it saw (path, client id, body bytes, port)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            payload = json.dumps({
                "backend": port,
                "method": self.command,
                "path": self.path,
                "client": self.headers.get("x-client-id"),
                "bytes": len(body),
            }).encode() + b"\n"
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    return server
