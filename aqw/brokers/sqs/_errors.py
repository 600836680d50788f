"""Which SQS errors mean what: unreachable or throttled (``SQSUnavailable``, retried by
the runtime), a receipt handle gone, a queue missing."""

from __future__ import annotations

import asyncio
from typing import Any

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError

from ...errors import BrokerUnavailable

#: Error codes meaning "this receipt handle no longer names a message we hold".
GONE = {
    "ReceiptHandleIsInvalid",
    "InvalidParameterValue",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
    "InvalidReceiptHandle",
}
_THROTTLED = {
    "ThrottlingException",
    "RequestThrottled",
    "Throttling",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "KMS.ThrottlingException",
    "AWS.SimpleQueueService.RequestThrottled",
}
MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


class SQSUnavailable(BrokerUnavailable, ConnectionError):
    """SQS could not be reached, or throttled the call: the runtime retries with backoff."""


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError | asyncio.TimeoutError):
        return True
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if response else 0
    return error_code(exc) in _THROTTLED or int(status or 0) >= 500


async def request(client: Any, op: str, **params: Any) -> dict[str, Any]:
    """One SQS call; unreachable or throttled becomes ``SQSUnavailable``."""
    try:
        reply: dict[str, Any] = await getattr(client, op)(**params)
    except Exception as exc:
        if _transient(exc):
            raise SQSUnavailable(f"SQS {op} failed: {exc}") from exc
        raise
    return reply
