"""A TCP server on 127.0.0.1 that accepts connections and never answers: a stalled endpoint."""

from __future__ import annotations

import socket
import threading


class StalledServer:
    """Accepts every connection, reads nothing back to the client and sends nothing; counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(conn)  # kept open, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self.accepted:
            conn.close()
        self.sock.close()

    def __enter__(self) -> StalledServer:
        return self

    def __exit__(self, *_) -> None:
        self.close()
