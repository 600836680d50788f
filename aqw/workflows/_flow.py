"""``Flow``: steps (jobs) with edges, on the batch machinery. A step after others is the
callback of a *gate*, a batch opened sealed whose members are its parents: the settle step
of the last parent enqueues it, exactly once (the same rule as a batch's callback), its
payload the parent's result (several parents: a mapping of step name to result), validated
against the step's payload type by the worker that runs it. A failed parent ends its
dependants cancelled, unrun, unless ``allow_failed=True`` (then they run, a failed parent's
result read as None). The flow itself is a batch of all its steps: it completes when every
step is final.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._ids import new_job_id
from .._text import quoted
from ..brokers import Broker
from ..brokers.batching import BATCH_HEADER, FLOW_INPUT_SLOT, BatchInfo, BatchSpec
from ..brokers.parts import BatchCounts
from ..errors import ConfigError
from ..job import Job
from ..record import JobInfo
from ..task import Task
from ..telemetry import BATCH_TRACE_HEADER, SPAN_FLOW_START, opening, step_spans
from ._batch import BatchApp, Build, batch_part


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a ``Flow``: what ``flow.add`` returns, to name as a later step's
    ``after``."""

    name: str
    task: Task[Any]
    payload: Any
    after: tuple[str, ...]
    allow_failed: bool
    flow: Flow = field(repr=False, compare=False)


class Flow:
    """Jobs with edges: ``raw = flow.add(fetch, Source(url=u))``, ``flow.add(parse,
    after=raw)``; then ``handle = await app.start(flow)``."""

    def __init__(self) -> None:
        self.steps: dict[str, Step] = {}

    def add(
        self,
        task: Task[Any],
        payload: Any = None,
        *,
        after: Step | Sequence[Step] | None = None,
        allow_failed: bool = False,
        name: str | None = None,
    ) -> Step:
        """Add a step of ``task``: with ``payload`` when it has no parents, else run once
        every step in ``after`` has ended (succeeded; or any final state with
        ``allow_failed``) with their results as its input. ``name``: the step's name
        (default the task's name after its last dot), unique in the flow."""
        if not isinstance(task, Task):
            raise ConfigError(f"flow.add: task must be a task (@app.task), got {quoted(task)}")
        step_name = task.name.rpartition(".")[2] if name is None else name
        if not isinstance(step_name, str) or not step_name or len(step_name.split()) != 1:
            raise ConfigError(f"flow.add: name must be one word, got {quoted(step_name)}")
        if step_name in self.steps:
            raise ConfigError(f"flow.add: a step named {step_name!r} exists; pass name=")
        parents = [] if after is None else [after] if isinstance(after, Step) else list(after)
        for parent in parents:
            if not isinstance(parent, Step) or parent.flow is not self:
                raise ConfigError(f"flow.add: after must be steps of this flow, got {parent!r}")
            if not parent.task.options.keep_result:
                raise ConfigError(
                    f"flow.add: step {parent.name!r} is a parent, so its task must keep its "
                    "result: @app.task(keep_result=True)"
                )
        if parents and payload is not None:
            raise ConfigError(
                f"flow.add: step {step_name!r} runs after others: its input is their "
                "results, so it takes no payload"
            )
        if not isinstance(allow_failed, bool):
            raise ConfigError(f"flow.add: allow_failed must be True or False, got {allow_failed!r}")
        names = tuple(dict.fromkeys(p.name for p in parents))
        step = Step(step_name, task, payload, names, allow_failed, self)
        self.steps[step_name] = step
        return step


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A step's state: its job's record's (``waiting`` while its parents run)."""

    name: str
    job_id: str
    task: str
    after: tuple[str, ...]
    state: str
    record: JobInfo | None = None


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """A flow's state (its batch's: ``complete`` once every step is final) and its steps."""

    id: str
    state: str
    steps: dict[str, StepInfo]
    batch: BatchInfo


async def start_flow(app: BatchApp, build: Build, flow: Flow, queue: str | None = None) -> str:
    """Start ``flow`` on ``queue`` (default the app's): its gates opened, its first steps
    enqueued; the flow's id."""
    if not isinstance(flow, Flow) or not flow.steps:
        raise ConfigError(f"app.start: give an aqw.Flow with steps, got {quoted(flow)}")
    queue = queue if queue is not None else app.queue
    part = batch_part(app.broker_for(queue))
    flow_id = new_job_id()
    tel = app.telemetry_for(queue)
    with opening(tel, SPAN_FLOW_START, flow_id) as trace:
        spans = step_spans(tel, flow_id, flow.steps) if trace is not None else {}
        await _start(app, build, flow, queue, part, flow_id, trace, spans)
    return flow_id


async def _start(
    app: BatchApp,
    build: Build,
    flow: Flow,
    queue: str,
    part: BatchCounts,
    flow_id: str,
    trace: str | None,
    spans: dict[str, str],
) -> None:
    ids = {name: new_job_id() for name in flow.steps}
    gates = {name: new_job_id() for name, s in flow.steps.items() if s.after}
    counts_in = {
        name: " ".join([flow_id, *(gates[d] for d, s in flow.steps.items() if name in s.after)])
        for name in flow.steps
    }
    roots: list[Job] = []
    gated: dict[str, Job] = {}
    for name, s in flow.steps.items():
        head = {BATCH_HEADER: counts_in[name]}
        if trace is not None:  # the flow's span and its parents' step spans: links
            parents = (spans[p] for p in s.after if p in spans)
            head[BATCH_TRACE_HEADER] = " ".join([trace, *parents])
            if name in spans:  # its own step span: its process span's parent
                head["traceparent"] = spans[name]
        if s.after:  # its payload: its parents' results, written in by its gate
            own = s.task.options.queue or app.queue
            if own != queue:
                raise ConfigError(
                    f"flow: task {s.task.name!r} sends its jobs to queue {own!r}, and the "
                    f"flow runs on queue {queue!r}: a flow's steps share its queue"
                )
            gated[name] = Job(
                id=ids[name],
                task=s.task.name,
                payload=FLOW_INPUT_SLOT,
                headers=head,
                priority=s.task.options.priority,
            )
        else:
            (job,) = build(s.task, [s.payload], head, queue, None)
            roots.append(job.model_copy(update={"id": ids[name]}))
    data = {
        name: {"job": ids[name], "task": s.task.name, "after": list(s.after)}
        for name, s in flow.steps.items()
    }
    ttl, keep = app.idempotency_ttl, app.keep_for
    members = tuple(ids.values())
    spec = BatchSpec(
        flow_id, {}, keep_for=keep, key_ttl=ttl, members=members, data=json.dumps(data)
    )
    await part.open(spec)
    for name, job in gated.items():
        s = flow.steps[name]
        kind = "complete" if s.allow_failed else "success"
        spec = BatchSpec(
            gates[name],
            {kind: job},
            keep_for=keep,
            key_ttl=ttl,
            members=tuple(ids[p] for p in s.after),
            sealed=True,
            inputs=s.after,
        )
        await part.open(spec)
    await part.add(flow_id, roots)
    await part.seal(flow_id)


async def flow_info(app: BatchApp, flow_id: str, queue: str | None = None) -> FlowInfo | None:
    """The flow's state and each step's, or None (unknown id, or expired)."""
    return await read_flow(app.broker_for(queue if queue is not None else app.queue), flow_id)


async def read_flow(broker: Broker, flow_id: str) -> FlowInfo | None:
    """``flow_info`` on ``broker``: the flow's batch and each step's record (one read each),
    or None (unknown id, expired, or a batch that is not a flow)."""
    info = await batch_part(broker).info(flow_id)
    if info is None or not info.data:
        return None
    steps: dict[str, StepInfo] = {}
    for name, s in dict(json.loads(info.data)).items():
        record = await broker.records.record(str(s["job"]))
        state = record.state if record is not None else "waiting"
        after = tuple(str(a) for a in s.get("after", ()))
        steps[name] = StepInfo(name, str(s["job"]), str(s["task"]), after, state, record)
    return FlowInfo(flow_id, info.state, steps, info)
