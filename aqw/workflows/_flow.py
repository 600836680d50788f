"""``Flow``: steps (jobs) with edges, on the batch machinery. A step after others is the
callback of a *gate*, a batch opened sealed whose members are its parents: the settle step
of the last parent enqueues it, exactly once (the same rule as a batch's callback), its
payload the parent's result (several parents: a mapping of step name to result), validated
against the step's payload type by the worker that runs it. A failed parent ends its
dependants cancelled, unrun, unless ``allow_failed=True`` (then they run, a failed parent's
result read as None). The flow itself is a batch of all its steps: it completes when every
step is final.

A *batch step* (``flow.batch(task, payloads)``) is a batch of children, one per payload, each
counted in the step's batch (``app.batch_info`` reads it), in the flow and in its
dependants' gates: a dependant's gate has every child as a member, so it is enqueued by the
settle of the last child, with the children's results, in order, as its input (a list; with
several parents, that list under the batch step's name). A batch step after other steps
gives each child a gate of its own on those parents: the last parent's settle enqueues them
all (or, a parent failed, ends them all cancelled, unrun).
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
    #: A batch step's children's payloads (None: a step of one job).
    children: tuple[Any, ...] | None = None
    #: A batch step's ``fail_fast``: its first failed child cancels the others.
    fail_fast: bool = False


#: A gate's input name for each child of a batch parent: the children's results are
#: gathered, in order, into a list under the name before it.
LIST_MARK = "[]"


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
        step_name, names = self._checked("flow.add", task, after, allow_failed, name)
        if names and payload is not None:
            raise ConfigError(
                f"flow.add: step {step_name!r} runs after others: its input is their "
                "results, so it takes no payload"
            )
        step = Step(step_name, task, payload, names, allow_failed, self)
        self.steps[step_name] = step
        return step

    def batch(
        self,
        task: Task[Any],
        payloads: Sequence[Any],
        *,
        after: Step | Sequence[Step] | None = None,
        allow_failed: bool = False,
        fail_fast: bool = False,
        name: str | None = None,
    ) -> Step:
        """Add a batch step: one child job of ``task`` per payload (at least one), run at
        once, or once every step in ``after`` has ended (succeeded; or any final state with
        ``allow_failed``). It ends when every child is final; a step after it gets the
        children's results, in order, as a list (``None`` for a child that did not
        succeed, with ``allow_failed``), and, without ``allow_failed``, is cancelled when a
        child fails. ``fail_fast``: the first failed child cancels the others. The step's
        batch is readable with ``app.batch_info`` and ``app.batch_results`` (its id is the
        step's ``job_id`` in ``flow_info``)."""
        step_name, names = self._checked("flow.batch", task, after, allow_failed, name)
        if isinstance(payloads, str | bytes) or not isinstance(payloads, Sequence):
            raise ConfigError(
                f"flow.batch: payloads must be a list (one child per payload), got "
                f"{quoted(payloads)}"
            )
        if not payloads:
            raise ConfigError(f"flow.batch: step {step_name!r} needs at least one payload")
        if not isinstance(fail_fast, bool):
            raise ConfigError(f"flow.batch: fail_fast must be True or False, got {fail_fast!r}")
        step = Step(step_name, task, None, names, allow_failed, self, tuple(payloads), fail_fast)
        self.steps[step_name] = step
        return step

    def _checked(
        self,
        call: str,
        task: Task[Any],
        after: Step | Sequence[Step] | None,
        allow_failed: object,
        name: str | None,
    ) -> tuple[str, tuple[str, ...]]:
        """A new step's name and its parents' names, checked."""
        if not isinstance(task, Task):
            raise ConfigError(f"{call}: task must be a task (@app.task), got {quoted(task)}")
        step_name = task.name.rpartition(".")[2] if name is None else name
        if (
            not isinstance(step_name, str)
            or not step_name
            or len(step_name.split()) != 1
            or step_name.endswith(LIST_MARK)
        ):
            raise ConfigError(
                f"{call}: name must be one word, not ending in {LIST_MARK}, got {quoted(step_name)}"
            )
        if step_name in self.steps:
            raise ConfigError(f"{call}: a step named {step_name!r} exists; pass name=")
        parents = [] if after is None else [after] if isinstance(after, Step) else list(after)
        for parent in parents:
            if not isinstance(parent, Step) or parent.flow is not self:
                raise ConfigError(f"{call}: after must be steps of this flow, got {parent!r}")
            if not parent.task.options.keep_result:
                raise ConfigError(
                    f"{call}: step {parent.name!r} is a parent, so its task must keep its "
                    "result: @app.task(keep_result=True)"
                )
        if not isinstance(allow_failed, bool):
            raise ConfigError(f"{call}: allow_failed must be True or False, got {allow_failed!r}")
        return step_name, tuple(dict.fromkeys(p.name for p in parents))


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A step's state: its job's record's (``waiting`` while its parents run). A batch
    step's: its batch's outcome once complete (``succeeded``, ``failed``, ``cancelled``),
    ``running`` once a child is final, else ``waiting`` (``queued`` without parents)."""

    name: str
    job_id: str
    task: str
    after: tuple[str, ...]
    state: str
    record: JobInfo | None = None
    #: A batch step's batch (its ``job_id`` is the batch's id); None for a step of one job.
    batch: BatchInfo | None = None


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
    # Each step's job ids: one for a step, one per child for a batch step (whose own id
    # is its batch's).
    ids = {name: new_job_id() for name in flow.steps}
    jobs = {
        name: [new_job_id() for _ in s.children] if s.children is not None else [ids[name]]
        for name, s in flow.steps.items()
    }
    # The gates of each job with parents: one per step, one per child of a batch step.
    gates = {name: [new_job_id() for _ in jobs[name]] for name, s in flow.steps.items() if s.after}
    counts_in = {
        name: [
            flow_id,
            *([ids[name]] if s.children is not None else []),
            *(g for d, o in flow.steps.items() if name in o.after for g in gates[d]),
        ]
        for name, s in flow.steps.items()
    }
    roots: list[Job] = []
    gated: dict[str, list[Job]] = {}
    for name, s in flow.steps.items():
        head = {BATCH_HEADER: " ".join(counts_in[name])}
        if trace is not None:  # the flow's span and its parents' step spans: links
            parents = (spans[p] for p in s.after if p in spans)
            head[BATCH_TRACE_HEADER] = " ".join([trace, *parents])
            if name in spans:  # its own step span: its process span's parent
                head["traceparent"] = spans[name]
        own = s.task.options.queue or app.queue
        if s.after and own != queue:
            raise ConfigError(
                f"flow: task {s.task.name!r} sends its jobs to queue {own!r}, and the "
                f"flow runs on queue {queue!r}: a flow's steps share its queue"
            )
        if s.children is not None:  # a batch step: its children's payloads are its own
            built = build(s.task, list(s.children), head, queue, None)
            pairs = zip(built, jobs[name], strict=True)
            mine = [job.model_copy(update={"id": i}) for job, i in pairs]
            if s.after:
                gated[name] = mine
            else:
                roots.extend(mine)
        elif s.after:  # its payload: its parents' results, written in by its gate
            gated[name] = [
                Job(
                    id=ids[name],
                    task=s.task.name,
                    payload=FLOW_INPUT_SLOT,
                    headers=head,
                    priority=s.task.options.priority,
                )
            ]
        else:
            (job,) = build(s.task, [s.payload], head, queue, None)
            roots.append(job.model_copy(update={"id": ids[name]}))
    data: dict[str, dict[str, Any]] = {}
    for name, s in flow.steps.items():
        data[name] = {"job": ids[name], "task": s.task.name, "after": list(s.after)}
        if s.children is not None:
            data[name]["batch"] = len(s.children)
    ttl, keep = app.idempotency_ttl, app.keep_for
    members = tuple(i for name in flow.steps for i in jobs[name])
    spec = BatchSpec(
        flow_id, {}, keep_for=keep, key_ttl=ttl, members=members, data=json.dumps(data)
    )
    await part.open(spec)
    for name, s in flow.steps.items():
        if s.children is not None:  # the batch step's own batch: its children
            spec = BatchSpec(
                ids[name],
                {},
                s.fail_fast,
                keep_for=keep,
                key_ttl=ttl,
                members=tuple(jobs[name]),
                sealed=True,
            )
            await part.open(spec)
    for name, step_jobs in gated.items():
        s = flow.steps[name]
        kind = "complete" if s.allow_failed else "success"
        members_of = tuple(i for p in s.after for i in jobs[p])
        # A batch step's children keep their own payloads: their gates take no input.
        inputs = () if s.children is not None else tuple(_inputs(flow, s.after))
        for gate, job in zip(gates[name], step_jobs, strict=True):
            spec = BatchSpec(
                gate,
                {kind: job},
                keep_for=keep,
                key_ttl=ttl,
                members=members_of,
                sealed=True,
                inputs=inputs,
            )
            await part.open(spec)
    await part.add(flow_id, roots)
    await part.seal(flow_id)


def _inputs(flow: Flow, after: tuple[str, ...]) -> list[str]:
    """A gate's input names, one per member: a parent step's name, or for each child of
    a batch parent its name marked as gathered into a list."""
    out: list[str] = []
    for p in after:
        children = flow.steps[p].children
        out += [p] if children is None else [p + LIST_MARK] * len(children)
    return out


async def flow_info(app: BatchApp, flow_id: str, queue: str | None = None) -> FlowInfo | None:
    """The flow's state and each step's, or None (unknown id, or expired)."""
    return await read_flow(app.broker_for(queue if queue is not None else app.queue), flow_id)


async def read_flow(broker: Broker, flow_id: str) -> FlowInfo | None:
    """``flow_info`` on ``broker``: the flow's batch and each step's record (one read each),
    or None (unknown id, expired, or a batch that is not a flow)."""
    part = batch_part(broker)
    info = await part.info(flow_id)
    if info is None or not info.data:
        return None
    steps: dict[str, StepInfo] = {}
    for name, s in dict(json.loads(info.data)).items():
        job_id, task = str(s["job"]), str(s["task"])
        after = tuple(str(a) for a in s.get("after", ()))
        if "batch" in s:
            batch = await part.info(job_id)
            state = _batch_state(batch, after)
            steps[name] = StepInfo(name, job_id, task, after, state, None, batch)
            continue
        record = await broker.records.record(job_id)
        state = record.state if record is not None else "waiting"
        steps[name] = StepInfo(name, job_id, task, after, state, record)
    return FlowInfo(flow_id, info.state, steps, info)


def _batch_state(batch: BatchInfo | None, after: tuple[str, ...]) -> str:
    """A batch step's state, from its batch (None: expired)."""
    if batch is None:
        return "expired"
    if batch.complete:
        return batch.outcome
    if batch.done:
        return "running"
    return "waiting" if after else "queued"
