"""SQS message fields as aqw writes and reads them: attribute names, typed attributes,
deduplication ids, lenient number parsing, and what a received body becomes (``prepare``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from typing import Any

from ...job import Job

NOT_BEFORE = "aqw-not-before"
FAILURE = "aqw-failure"
SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]
_DEDUP_ID = re.compile(r"^[!-~]{1,128}$")

#: One entry of a SendMessage/DeleteMessage/ChangeMessageVisibility call or batch.
Entry = dict[str, Any]


def as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def sent_timestamp(msg: dict[str, Any]) -> int:
    return as_int(msg.get("Attributes", {}).get("SentTimestamp"), 0)


def typed_attributes(attrs: dict[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"DataType": "String", "StringValue": v} for k, v in attrs.items() if v}


def string_attributes(msg: dict[str, Any]) -> dict[str, str]:
    return {
        k: str(v["StringValue"])
        for k, v in msg.get("MessageAttributes", {}).items()
        if "StringValue" in v
    }


def raw_attributes(msg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keep = ("DataType", "StringValue", "BinaryValue")
    return {
        k: {f: v[f] for f in keep if f in v} for k, v in msg.get("MessageAttributes", {}).items()
    }


def dedup_id(value: str) -> str:
    return value if _DEDUP_ID.match(value) else hashlib.sha256(value.encode()).hexdigest()


def task_of(data: bytes) -> str:
    with contextlib.suppress(ValueError):
        value = json.loads(data)
        if isinstance(value, dict) and isinstance(value.get("task"), str):
            return str(value["task"])
    return ""


def prepare(
    body: str,
    attrs: dict[str, str],
    count: int,
    mid: str,
    system: dict[str, Any],
    default_task: str | None,
) -> tuple[bytes, str | None]:
    """The bytes handed to the runtime and the job id (None: not a job). An aqw envelope gets
    ``attempt = max(attempt, receive count)``; plain JSON is wrapped for ``default_task``."""
    job_id = attrs.get("aqw-job-id")
    if job_id and count <= as_int(attrs.get("aqw-attempt"), 1):
        return body.encode(), job_id
    try:
        value = json.loads(body)
    except ValueError:
        return body.encode(), None
    if isinstance(value, dict) and "task" in value and ("v" in value or not default_task):
        changed = False
        if "id" not in value:
            value["id"], changed = mid, True
        attempt = value.get("attempt", 1)
        if isinstance(attempt, int) and count > attempt:
            value["attempt"], changed = count, True
        ident = value["id"] if isinstance(value["id"], str) and value["id"] else None
        if changed:
            return json.dumps(value, separators=(",", ":")).encode(), ident
        return body.encode(), ident
    if not default_task:
        return body.encode(), None
    headers = {k: attrs[k] for k in ("traceparent", "tracestate") if attrs.get(k)}
    sent = as_int(system.get("SentTimestamp"), 0) / 1000 or time.time()
    job = Job(
        id=mid,
        task=default_task,
        payload=value,
        attempt=max(1, count),
        enqueued_at=sent,
        headers=headers,
    )
    return job.encode(), mid
