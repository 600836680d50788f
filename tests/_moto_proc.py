"""A moto server (SQS and the other AWS APIs) in a process of its own: ``python
tests/_moto_proc.py`` prints its port on one line once it answers, and stops when its stdin
closes (the test process that started it ended, however it ended).

Its own process, not a thread of the test process: moto's request handling is CPU-heavy
Python, and in the test's process it held the GIL against the test's event loop. And its
``receive_message`` runs one call at a time: moto checks a message's visibility and marks it
received without a lock, so two concurrent receives (the SQS broker runs several at once on
a backlog) were seen to be handed the same message, which SQS never does within its
visibility timeout."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from moto import server
from moto.sqs.models import SQSBackend

_receive = SQSBackend.receive_message
_one_at_a_time = threading.Lock()


def _serialized_receive(
    self: SQSBackend,
    queue_name: str,
    count: int,
    wait_seconds_timeout: int,
    visibility_timeout: int,
    message_attribute_names: list[str] | None = None,
) -> Any:
    """moto's receive, each look at the queue under the lock and a long poll's waits
    outside it (a waiting receive holds up no other)."""
    end = time.monotonic() + wait_seconds_timeout
    while True:
        with _one_at_a_time:
            got = _receive(self, queue_name, count, 0, visibility_timeout, message_attribute_names)
        left = end - time.monotonic()
        if got or left <= 0:
            return got
        self.get_queue(queue_name).wait_for_messages(min(1.0, left))  # type: ignore[arg-type]
        time.sleep(0.01)  # visible messages no receive may take (a FIFO group in flight)


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    SQSBackend.receive_message = _serialized_receive  # type: ignore[method-assign]
    moto = server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    _, port = moto.get_host_and_port()
    print(port, flush=True)
    sys.stdin.read()  # until the parent closes it or dies
    moto.stop()


if __name__ == "__main__":
    main()
