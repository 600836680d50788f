"""Which SQS errors mean what: unreachable or throttled (``SQSUnavailable``, retried by
the runtime), a receipt handle gone, a queue missing; and the set-up mistakes (no region, no
or refused credentials: ``ConfigError``; an endpoint that cannot be reached) as one line
that names the broker and what to fix."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import (
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    TokenRetrievalError,
)

from ...errors import AqwError, BrokerUnavailable, ConfigError

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
#: Error codes meaning "AWS does not accept who we are" (besides every ``AccessDenied...``).
REFUSED = {
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidSecurity",
    "AuthFailure",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
}
_CREDENTIALS = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run with an IAM role"
)


class SQSUnavailable(BrokerUnavailable, ConnectionError):
    """SQS could not be reached, or throttled the call: the runtime retries with backoff."""


class RecordsUnavailable(BrokerUnavailable, ConnectionError):
    """The ``records=`` store of idempotency keys could not be reached: the runtime retries
    with backoff."""


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError | asyncio.TimeoutError):
        return True
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if response else 0
    return error_code(exc) in _THROTTLED or int(status or 0) >= 500


def broker_name(queue: str | None) -> str:
    """How a message names the broker: ``sqs://QUEUE`` (the queue's name or URL)."""
    return f"sqs://{queue}" if queue else "the sqs:// broker"


def set_up_mistake(exc: BaseException, broker: str) -> AqwError | None:
    """``exc`` as one line naming ``broker`` and what to fix, when it is a mistake in setting
    up SQS: no region, missing or refused credentials (``ConfigError``), an endpoint that
    cannot be reached (``SQSUnavailable``). None for any other error."""
    if isinstance(exc, NoRegionError):
        return ConfigError(
            f"{broker}: no AWS region: set AWS_DEFAULT_REGION or add ?region=... to the URL"
        )
    if isinstance(exc, NoCredentialsError):
        return ConfigError(f"{broker}: no AWS credentials found: {_CREDENTIALS}")
    if isinstance(exc, PartialCredentialsError | CredentialRetrievalError | TokenRetrievalError):
        return ConfigError(f"{broker}: AWS credentials are incomplete ({exc}): {_CREDENTIALS}")
    code, message = _refusal(exc)
    if code in REFUSED or code.startswith("AccessDenied") or _status(exc) in (401, 403):
        refused = f"{code}: {message}" if message else code
        return ConfigError(
            f"{broker}: AWS refused the credentials ({refused}): check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the IAM role) and that their IAM policy "
            "allows SQS on this queue"
        )
    if isinstance(exc, ValueError) and str(exc).startswith("Invalid endpoint"):
        return ConfigError(f"{broker}: {exc}: endpoint_url= must look like http://host:port")
    if isinstance(exc, EndpointConnectionError):
        endpoint = exc.kwargs.get("endpoint_url", "") or "the SQS endpoint"
        return SQSUnavailable(
            f"{broker}: cannot reach SQS at {endpoint}: check endpoint_url= and the region "
            "in the URL, and the network"
        )
    return None


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
    return int(meta.get("HTTPStatusCode", 0) or 0)


def _refusal(exc: BaseException) -> tuple[str, str]:
    """The error code and message of a ClientError, also when the body was XML the client
    could not parse (the code is then the HTTP status, the message the raw body)."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code, message = str(error.get("Code", "")), " ".join(str(error.get("Message", "")).split())
    found = re.search(r"<Code>([^<]+)</Code>", message)
    if found:
        said = re.search(r"<Message>([^<]*)</Message>", message)
        code, message = found[1], (said[1] if said else "")
    return code, message


def _queue_of(params: dict[str, Any]) -> str | None:
    queue = params.get("QueueName") or params.get("QueueUrl")
    return str(queue) if queue else None


async def request(client: Any, op: str, **params: Any) -> dict[str, Any]:
    """One SQS call; unreachable or throttled becomes ``SQSUnavailable``, a set-up mistake
    (``set_up_mistake``) the one-line error that names the queue and the fix."""
    try:
        reply: dict[str, Any] = await getattr(client, op)(**params)
    except Exception as exc:
        broker = broker_name(_queue_of(params))
        mistake = set_up_mistake(exc, broker)
        if mistake is not None:
            raise mistake from exc
        if _transient(exc):
            raise SQSUnavailable(f"{broker}: SQS {op} failed: {exc}") from exc
        raise
    return reply
