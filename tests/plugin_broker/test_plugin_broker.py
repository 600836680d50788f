"""A broker written outside aqw (``plugin_broker``, this package): installed by the test into
a temp dir with an ``aqw.brokers`` entry point for ``plug://``, found by ``aqw.brokers.
from_url`` through ``importlib.metadata`` alone, it passes the contract suite of the parts
it has (``aqw.testing.contract``) and runs a worker end to end."""

from __future__ import annotations

import ast
import importlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import aqw
import plugin_broker
from aqw.brokers import from_url
from aqw.testing.contract import (
    MarksContract,
    RecordsContract,
    StatusContract,
    Subject,
    TransportContract,
)
from tests._helpers import run_burst

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``aqw-plug`` installed in ``tmp_path``: its metadata and its entry point, as pip
    leaves them (the code itself is this package, already importable)."""
    info = tmp_path / "aqw_plug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aqw-plug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[aqw.brokers]\nplug = plugin_broker:from_url\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    plugin_broker.QUEUES.clear()


@pytest.fixture
async def subject(installed: Path) -> AsyncIterator[Subject]:
    """The contract's broker: ``plug://`` found through its entry point."""
    queue = f"p-{uuid.uuid4().hex[:8]}"

    def new_broker(**_: Any) -> aqw.Broker:
        return from_url(f"plug://{queue}")

    yield Subject(new_broker, queue)


class TestPlugTransport(TransportContract):
    pass


class TestPlugRecords(RecordsContract):
    pass


class TestPlugStatus(StatusContract):
    pass


class TestPlugMarks(MarksContract):
    pass


def test_it_uses_the_public_contract_only() -> None:
    """No private module or name of aqw is imported (the seam a broker author sees)."""
    tree = ast.parse(Path(plugin_broker.__file__).read_text(encoding="utf-8"))
    taken = [
        (node.module or "", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aqw")
        for alias in node.names
    ]
    assert taken, "it builds on aqw"
    private = [(m, n) for m, n in taken if any(p.startswith("_") for p in (*m.split("."), n))]
    assert private == []


def test_without_its_entry_point_the_scheme_is_unknown() -> None:
    with pytest.raises(aqw.ConfigError, match=r"unknown broker URL 'plug://q'.*aqw\.brokers"):
        from_url("plug://q")


def test_the_entry_point_refuses_partitions(installed: Path) -> None:
    assert isinstance(from_url("plug://q"), plugin_broker.PlugBroker)
    with pytest.raises(aqw.ConfigError, match="partitions=2: only a Redis queue"):
        from_url("plug://q", partitions=2)


async def test_a_worker_runs_its_jobs_end_to_end(installed: Path) -> None:
    app = aqw.App("plug://orders", retry=aqw.RetryPolicy(max_retries=1, base=0.01))
    assert isinstance(app.broker, plugin_broker.PlugBroker)
    seen: list[tuple[int, int]] = []

    @app.task(name="double", keep_result=True)
    async def double(n: int, ctx: aqw.Context) -> int:
        seen.append((n, ctx.attempt))
        if n == 3 and ctx.attempt == 1:
            raise RuntimeError("the first try fails")
        return n * 2

    @app.task(name="explode", max_retries=0)
    async def explode(n: int) -> None:
        raise ValueError(f"bad {n}")

    ok = (await app.enqueue(double, [21]))[0]
    flaky = (await app.enqueue(double, [3]))[0]
    dead = (await app.enqueue(explode, [5]))[0]
    other = app.broker_for("audit")  # another queue beside it (Broker.sibling)
    assert isinstance(other, plugin_broker.PlugBroker) and other.queue == "audit"
    await run_burst(app, concurrency=4)
    assert await app.result(ok, timeout=1) == 42
    assert await app.result(flaky, timeout=1) == 6
    with pytest.raises(aqw.JobFailed, match="bad 5"):
        await app.result(dead, timeout=1)
    assert sorted(seen) == [(3, 1), (3, 2), (21, 1)]
    [entry] = await app.broker.dlq_list()
    info = await app.job(dead)
    assert entry.job_id == dead and info is not None and info.dlq_entry == entry.id
    assert (await app.broker.depth()).as_dict() == {
        "waiting": 0,
        "in_flight": 0,
        "delayed": 0,
        "dead": 1,
    }
