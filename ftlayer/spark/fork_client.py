"""The launcher's client of ftlayer.spark.forkserver: ``python -S fork_client.py SOCKET
PYTHON ARG...`` asks the server to run ``PYTHON ARG...`` as a fork of its warm process,
and stands in for that process until it ends.

Run as a script by a Python started with ``-S``: it imports only the standard library
(starting it costs a few milliseconds). Anything other than ``-m MODULE``, and any failure
before the server named its child, runs ``PYTHON ARG...`` itself (``exec``): the plain
start, never a second run. Once the child runs, the client exits with the child's exit
code (1 if the child died without writing it: a signal) and passes SIGTERM, SIGINT,
SIGHUP and SIGQUIT on to it.
"""

import json
import os
import signal
import socket
import struct
import sys

HEADER = struct.Struct("!I")  # as ftlayer.spark.forkserver: kept equal by a test
PID = struct.Struct("!q")


def _child(path: str, argv: list[str], status: int) -> int:
    """The pid of the child the server forked for ``argv``; raises when there is none."""
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.settimeout(None)  # the server replies once its imports are done: then at once
        socket.send_fds(s, [HEADER.pack(len(body))], [0, 1, 2, status])
        s.sendall(body)
        reply = b""
        while len(reply) < PID.size:
            part = s.recv(PID.size - len(reply))
            if not part:
                raise ConnectionError("the server forked no child")
            reply += part
    return int(PID.unpack(reply)[0])


def main() -> None:
    path, python, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    read, write = os.pipe()
    pid = None
    if len(args) >= 2 and args[0] == "-m":
        try:
            pid = _child(path, args, write)
        except Exception:  # noqa: BLE001 (no server, or a refused request: start plainly)
            pid = None
    if pid is None:
        os.close(read)
        os.close(write)
        os.execvp(python, [python, *args])  # a bare name (python3) as sh finds it
    os.close(write)

    def forward(signum: int, _: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    got = b""
    while True:
        try:
            part = os.read(read, 64)
        except InterruptedError:
            continue
        if not part:
            break
        got += part
    try:
        code = int(got)
    except ValueError:
        code = 1
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
