"""``sqs://`` URLs: the queue name or queue URL, and the options after ``?``."""

from __future__ import annotations

import re
from typing import TypedDict
from urllib.parse import parse_qs, urlsplit

from ...errors import ConfigError
from ..redis import split_queue
from ._keys import REDIS_SCHEMES, check_records_url, scheme_of

_OPTIONS = {
    "region",
    "endpoint_url",
    "dlq",
    "wait",
    "visibility",
    "task",
    "create",
    "locks",
    "records",
    "pool",
    "pollers",
}
_AWS_HOST = re.compile(r"^(?:sqs\.([a-z0-9-]+)|([a-z0-9-]+)\.queue)\.amazonaws\.com")


class Settings(TypedDict):
    """The keyword arguments of ``SQSBroker(name, ...)`` an ``sqs://`` URL gives."""

    queue_url: str | None
    region: str | None
    endpoint_url: str | None
    dlq: str | None
    wait: int | None
    visibility: int | None
    default_task: str | None
    create: bool
    lock_store: str | None
    records: str | None
    pool: int
    pollers: int


def parse_url(url: str, queue: str) -> tuple[str, Settings]:
    """The queue name and the settings of ``sqs://NAME?opts`` or
    ``sqs://https://host/ACCOUNT/NAME?opts``; ``queue`` names the queue when the URL does not.

    Option values are percent-decoded once, a bare ``+`` staying a plus sign (not a space);
    ``locks=`` is a redis URL whose own query is re-encoded as ``redis://`` broker URLs are
    (``split_queue``), so ``locks=rediss://h/0?ssl_ca_certs=/a+b/ca.pem`` reaches redis-py
    with ``/a+b/ca.pem``. ``records=`` is a redis URL (re-encoded the same way) or a
    ``postgresql://`` DSN (passed to asyncpg as decoded); anything else is a ConfigError that
    names the option. An ``&`` inside the ``locks=`` or ``records=`` URL is written ``%26``."""
    if not url.lower().startswith("sqs://"):
        raise ConfigError(f"not an sqs:// URL: {url!r}")
    rest, _, query = url[len("sqs://") :].partition("?")
    pairs = parse_qs(query.replace("+", "%2B"), keep_blank_values=True)
    opts = {k: v[-1] for k, v in pairs.items()}
    unknown = sorted(set(opts) - _OPTIONS)
    if unknown:
        known = ", ".join(sorted(_OPTIONS))
        raise ConfigError(f"unknown sqs:// option(s) {', '.join(unknown)} (known: {known})")
    region, endpoint, queue_url = opts.get("region"), opts.get("endpoint_url"), None
    if rest.lower().startswith(("http://", "https://")):
        queue_url = rest
        parts = urlsplit(rest)
        name = parts.path.rstrip("/").rsplit("/", 1)[-1]
        aws = _AWS_HOST.match(parts.hostname or "")
        if aws:
            region = region or aws.group(1) or aws.group(2)
        else:
            endpoint = endpoint or f"{parts.scheme}://{parts.netloc}"
    else:
        name = rest.strip("/") or queue
    if not name:
        raise ConfigError(f"sqs:// URL names no queue: {url!r}")
    return name, Settings(
        queue_url=queue_url,
        region=region,
        endpoint_url=endpoint,
        dlq=opts.get("dlq") or None,
        wait=_int_option(opts, "wait"),
        visibility=_int_option(opts, "visibility"),
        default_task=opts.get("task") or None,
        create=opts.get("create", "0").lower() in ("1", "true", "yes"),
        lock_store=_redis_url(opts.get("locks")),
        records=_records_url(opts.get("records")),
        pool=_int_option(opts, "pool") or 50,
        pollers=_int_option(opts, "pollers") or 10,
    )


def _redis_url(url: str | None) -> str | None:
    if not url:
        return None
    return split_queue(url, "")[0]


def _records_url(url: str | None) -> str | None:
    if not url:
        return None
    if scheme_of(check_records_url(url)) in REDIS_SCHEMES:
        return _redis_url(url)
    return url


def _int_option(opts: dict[str, str], name: str) -> int | None:
    if not opts.get(name):
        return None
    try:
        return int(opts[name])
    except ValueError:
        raise ConfigError(f"sqs:// option {name}= must be an integer, got {opts[name]!r}") from None
