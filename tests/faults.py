"""Real faults for tests: a TCP proxy on loopback between a client and Redis that can
swallow Redis's replies (the request is applied, the answer never arrives) or refuse
connections, as a dropped link or a partition would."""

from __future__ import annotations

import select
import socket
import threading
from typing import Literal

__all__ = ["TcpProxy"]

Mode = Literal["forward", "swallow_replies", "refuse"]


class TcpProxy:
    """``127.0.0.1:<port>`` forwarding to ``target_port``. Modes:

    * ``forward``: a plain relay;
    * ``swallow_replies``: requests reach Redis; once a connection has sent a request
      holding ``marker`` (e.g. ``b"EVALSHA"``; None: any), the next reply on it is dropped
      and the connection closed (Redis ran the command, the client sees a dropped
      connection);
    * ``refuse``: new connections are closed at once (Redis unreachable).

    Use as a context manager; ``mode`` may change at any time."""

    def __init__(
        self, target_port: int, marker: bytes | None = None, limit: int | None = None
    ) -> None:
        self.target_port = target_port
        self.marker = marker
        self.limit = limit  # swallow_replies: drop at most this many replies, then forward
        self.mode: Mode = "forward"
        self.swallowed = 0  # replies dropped so far
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def __enter__(self) -> TcpProxy:
        t = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            t = threading.Thread(target=self._relay, args=(client,), daemon=True)
            t.start()
            self._threads.append(t)

    def _relay(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            client.close()
            return
        armed = False  # swallow_replies: this connection sent the marked request
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if self.mode == "swallow_replies":
                            armed = armed or self.marker is None or self.marker in data
                        server.sendall(data)
                    elif self.mode == "forward" or not armed or self.limit == self.swallowed:
                        client.sendall(data)
                    else:  # the reply is lost, and so is the connection
                        self.swallowed += 1
                        return
        except OSError:
            return
        finally:
            client.close()
            server.close()
