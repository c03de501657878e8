"""Real faults for tests: a TCP proxy on loopback between a client and Redis that can
swallow Redis's replies (the request is applied, the answer never arrives) or refuse
connections, as a dropped link or a partition would; and ``kill_session``, ``kill -9`` of
every process of a session (a driver machine dying with its JVM and Python workers)."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

from ftlayer import EmbeddedRedis
from ftlayer.acker import AckEntry
from ftlayer.ids import shard_of
from ftlayer.wire import ENTRY_BYTES, NOFRAME

__all__ = ["ScriptCalls", "TcpProxy", "kill_session", "session_pids", "socket_owner"]

Mode = Literal["forward", "swallow_replies", "hold_replies", "refuse"]


class ScriptCalls(NamedTuple):
    """A server and how ftlayer's scripts reach it: a lost-reply proxy matches ``marker``,
    the command each script call starts with (EVALSHA, or FCALL for a function library;
    conftest's ``script_calls`` gives both)."""

    server: EmbeddedRedis
    marker: bytes
    script_mode: str


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
        self,
        target_port: int,
        marker: bytes | None = None,
        limit: int | None = None,
        arm_if: Callable[[int], bool] | None = None,
    ) -> None:
        self.target_port = target_port
        self.marker = marker
        self.limit = limit  # swallow_replies: drop at most this many replies, then forward
        self.mode: Mode = "forward"
        self.swallowed = 0  # replies dropped so far
        self.arm_if = arm_if  # called with the client's port: hold/swallow only if True
        self.held = threading.Event()  # hold_replies: a reply is being held
        self.held_peer = 0  # hold_replies: the client's port of the held connection
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
                        if self.mode in ("swallow_replies", "hold_replies") and not armed:
                            armed = self._arm(data, client)
                        server.sendall(data)
                    elif self.mode == "forward" or not armed or self.limit == self.swallowed:
                        client.sendall(data)
                    else:  # the reply is lost, and so is the connection
                        self.swallowed += 1
                        if self.mode == "hold_replies":
                            self.held_peer = client.getpeername()[1]
                            self.held.set()
                            self._until_closed(client)
                        return
        except OSError:
            return
        finally:
            client.close()
            server.close()

    def _arm(self, data: bytes, client: socket.socket) -> bool:
        if self.marker is not None and self.marker not in data:
            return False
        return self.arm_if is None or self.arm_if(client.getpeername()[1])

    def _until_closed(self, client: socket.socket) -> None:
        """Read and drop what ``client`` sends until it goes away (or the proxy stops)."""
        while not self._stop.is_set():
            ready, _, _ = select.select([client], [], [], 0.05)
            if ready and not client.recv(65536):
                return


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after "pid (comm)" -- state, ppid, pgrp,
    session, ... -- (comm may hold spaces); None once the process has exited."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is a descendant of ``ancestor`` (its parent, its parent's
    parent, ...; Linux ``/proc``); False once a process on the way has exited."""
    while pid > 1:
        fields = stat_fields(pid)
        if fields is None:
            return False
        pid = int(fields[1])
        if pid == ancestor:
            return True
    return False


def session_pids(sid: int) -> list[int]:
    """The processes whose session id is ``sid`` (Linux ``/proc``)."""
    pids = []
    for name in os.listdir("/proc"):  # not Path.glob: it stats entries that may vanish
        if name.isdigit() and (fields := stat_fields(name)) and int(fields[3]) == sid:
            pids.append(int(name))
    return pids


def kill_session(sid: int) -> int:
    """``kill -9`` every process of session ``sid`` (started with
    ``start_new_session=True``: its sid is its pid), including those that moved to a
    process group of their own (PySpark's worker daemon does). Returns how many."""
    pids = session_pids(sid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def socket_owner(local_port: int) -> int | None:
    """The pid of the process holding the loopback TCP socket bound to ``local_port``
    (Linux ``/proc/net/tcp``: its inode, then the process with that inode open)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{local_port:04X}":
            inode = fields[9]
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            fds = list(fd_dir.iterdir())
        except OSError:  # the process exited, or is not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    return int(fd_dir.parent.name)
            except OSError:  # this fd was closed meanwhile: the others still count
                continue
    return None


def stored_ids(layer: Any) -> list[int]:
    """The source ids of every record stored in Redis (pending or queued), read directly
    (each bucket's entries that hold a frame): what a model test compares its model with."""
    out = []
    for shard in layer.keyspace.shards:
        for key in layer.client.scan_iter(match=shard.buckets_pattern, count=1000):
            base = int(key.rsplit(b":", 1)[1], 16)  # the id's bytes 1..5 and 7..8
            raw = layer.client.get(key) or b""
            for slot in range(len(raw) // ENTRY_BYTES):
                entry = AckEntry.decode(raw, slot * ENTRY_BYTES)
                if entry is not None and entry.frame_offset != NOFRAME:
                    out.append(((base >> 16) << 24) | (slot << 16) | (base & 0xFFFF))
    return out


def corrupt_stored_frame(layer: Any, source_id: int, at: int) -> bytes:
    """Flip the bits of byte ``at`` (negative: from the end) of a stored record's frame,
    in place in its bucket's frames; returns the frame as it is now."""
    shard = layer.keyspace[shard_of(source_id, len(layer.keyspace))]
    off = AckEntry.read(layer.client, shard, source_id).frame_offset
    fkey = shard.bucket(source_id)[1]
    frame = bytearray(layer.persistence.stored(source_id))
    frame[at] ^= 0xFF
    layer.client.setrange(fkey, off, bytes(frame))
    return bytes(frame)
