"""aqw, measured with the same harness and work as its peers.

* every job runs the full job path: decode and validate the envelope, take the job's lease
  (``SET NX PX`` + fencing ``INCR``, renewed by the lease keeper), run the handler
  (``await rec.job(t)``, see ``--work``), settle with one atomic ack script that also
  releases the lease (lease on, telemetry off);
* enqueue = ``await work.enqueue(t)`` (one XADD);
* worker = ``app.worker(concurrency=--concurrency)`` in-process, a second ``App`` with its
  own connection pool, as a separate worker process would have.

Installed from this repository into its own venv by setup_peers.sh:

    benchmarks/.venv-peers/peers/aqw/bin/python benchmarks/peers/peer_aqw.py

Phases, timeouts and output are those of ``_bench.py``.
"""

from __future__ import annotations

from _bench import Config, Recorder, Session, main

import aqw

QUEUE = "bench"


def make_app(cfg: Config, rec: Recorder) -> tuple[aqw.App, aqw.Task[None]]:
    app = aqw.App(cfg.url, queue=QUEUE)

    @app.task(name="work")
    async def work(t: float) -> None:
        await rec.job(t)

    return app, work


class AqwSession:
    def __init__(self, cfg: Config, rec: Recorder) -> None:
        self.cfg = cfg
        self.rec = rec
        self.producer, self.work = make_app(cfg, rec)
        self.worker_app: aqw.App | None = None
        self.worker: aqw.Worker | None = None

    async def enqueue(self, t: float) -> None:
        await self.work.enqueue(t)

    async def start_worker(self) -> None:
        self.worker_app, _ = make_app(self.cfg, self.rec)
        self.worker = self.worker_app.worker(concurrency=self.cfg.concurrency)
        await self.worker.start()

    async def stop_worker(self) -> None:
        if self.worker is not None:
            await self.worker.stop(grace=5.0)
        if self.worker_app is not None:
            await self.worker_app.close()

    async def close(self) -> None:
        await self.producer.close()


async def open_session(cfg: Config, rec: Recorder) -> Session:
    return AqwSession(cfg, rec)


if __name__ == "__main__":
    main("aqw", "aqw", open_session, deps=("aqw", "redis", "hiredis"))
