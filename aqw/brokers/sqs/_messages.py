"""SQS message fields as aqw writes and reads them: attribute names, typed attributes,
deduplication ids and lenient number parsing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from typing import Any

NOT_BEFORE = "aqw-not-before"
FAILURE = "aqw-failure"
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]
_DEDUP_ID = re.compile(r"^[!-~]{1,128}$")

#: One entry of a SendMessage/DeleteMessage/ChangeMessageVisibility call or batch.
Entry = dict[str, Any]


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _sent(msg: dict[str, Any]) -> int:
    return _int(msg.get("Attributes", {}).get("SentTimestamp"), 0)


def _typed(attrs: dict[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"DataType": "String", "StringValue": v} for k, v in attrs.items() if v}


def _string_attributes(msg: dict[str, Any]) -> dict[str, str]:
    return {
        k: str(v["StringValue"])
        for k, v in msg.get("MessageAttributes", {}).items()
        if "StringValue" in v
    }


def _raw_attributes(msg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keep = ("DataType", "StringValue", "BinaryValue")
    return {
        k: {f: v[f] for f in keep if f in v} for k, v in msg.get("MessageAttributes", {}).items()
    }


def _dedup_id(value: str) -> str:
    return value if _DEDUP_ID.match(value) else hashlib.sha256(value.encode()).hexdigest()


def _task_of(data: bytes) -> str:
    with contextlib.suppress(ValueError):
        value = json.loads(data)
        if isinstance(value, dict) and isinstance(value.get("task"), str):
            return str(value["task"])
    return ""
