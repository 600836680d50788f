"""A producer killed mid-enqueue (``test_keyed_crash.py``): it enqueues one job with an
idempotency key on a NATS queue and SIGKILLs itself at the step named on the command line,
``claimed`` (the key claimed, nothing published) or ``published`` (the job published, the
claim not confirmed). Prints the job's id first.

    python keyed_producer.py URL QUEUE KEY STEP"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from aqw.brokers.nats import NatsBroker, Settings
from aqw.brokers.nats._keys import Keys
from aqw.brokers.nats._unique import UniqueEnqueue
from aqw.job import Job


def _die(*_: Any, **__: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, queue: str, key: str, step: str) -> None:
    if step == "claimed":
        UniqueEnqueue._publish_once = _die  # type: ignore[method-assign]
    else:
        Keys.confirm = _die  # type: ignore[method-assign]
    broker = NatsBroker(queue, [url], Settings(ack_wait=2.0))
    job = Job(task="work", payload={"n": 1}, key=key)
    print(job.id, flush=True)
    await broker.publish_unique(job, 600, None)
    raise SystemExit("the producer was not killed")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
