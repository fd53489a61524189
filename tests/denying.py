"""A local HTTP server on 127.0.0.1 that denies every request with 403, in a store's own words."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODIES = {
    "gcs": ("application/json", b'{"error": {"code": 403, "message": "Permission denied", "errors": [{"reason": "forbidden"}]}}'),
}


@contextmanager
def denying_server(store: str) -> Iterator[str]:
    content_type, body = BODIES[store]

    class Deny(BaseHTTPRequestHandler):
        timeout = 10

        def log_message(self, *args) -> None:
            pass

        def _handle(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(403)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
