"""NATS JetStream broker (nats-py, the ``nats`` extra): ``aqw.App("nats://127.0.0.1:4222",
queue="emails")``.

URL: ``nats://host:port[,host:port...]/?queue=NAME&replicas=R&ack_wait=S&max_deliver=N&
dlq_limit=N`` (credentials in the URL's user part go to the server, never to a log line).

How aqw's model maps onto JetStream (``docs/brokers/nats.md`` for the whole story):

- **A stream per queue** (``_layout.py``): work-queue retention, one durable pull consumer
  ``aqw`` shared by every worker of the queue, fetched in batches.
- **The ack window is the delivery's lease.** ``AckWait`` is the workers' longest lease TTL
  (``expect_lease_ttl``; it only grows, unless the URL's ``ack_wait=`` sets it);
  ``keep_alive`` sends ``+WPI`` as a request and waits for the reply; the window's confirmed
  end (``_window.py``) refuses every renewal and settle once it has passed, so the late ack
  the server would take (it redelivered the message already) is never sent.
- **The job's lease and its fencing token** are a KV key per running job (``_leases.py``):
  the revision of the write that took it is the token; a settle releases it with
  ``delete(last=revision)`` before its ack, and is refused when another holder wrote it.
- **Retries** are published anew (the next attempt's body) to the delayed stream under a
  ``Nats-Msg-Id`` unique to the delivery, then the delivery is acked: the attempt count is
  the job's own, not the delivery count (a ``nak(delay)`` would count every crash and every
  promotion as an attempt). ``promote_due`` moves due jobs to the queue. A give-back is a
  ``-NAK``: the same message, at once. ``MaxDeliver`` (``max_deliver=``, default unbounded)
  is the server's bound; aqw's own (``max_deliveries``) dead-letters first, with the reason.
- **Dead letters** in the ``AQW_q_DLQ`` stream (``_dead.py``).
- **Idempotency keys and completion records** in the ``AQW_q_KEYS`` bucket (``_keys.py``):
  a pending claim holds its job until the publish is confirmed (``_unique.py``), so a
  producer killed between the two leaves a job the next enqueue of the key publishes (dedup
  by ``Nats-Msg-Id``).
- **Job records** in the ``AQW_q_RECORDS`` bucket (``_records.py``), worker heartbeats and
  schedule marks in ``AQW_q_STATE`` (``_state.py``): shared by every process. The start step
  is ``_start.py``; rate limits and per-key caps, by compare-and-set in ``AQW_q_STATE``, are
  ``_limits.py``; limits changed at run time are one key of ``AQW_q_STATE``
  (``_run_limits.py``). The dashboard's depth samples are ``AQW_q_DEPTH`` (``_history.py``).
- **Debounce**: the key's waiting job in ``AQW_q_KEYS``, changed by compare-and-set, and a
  timer in the delayed stream (``_debounce.py``).
- Priority levels 0-9: a subject and a consumer per level, announced in ``AQW_q_STATE``
  and watched (``_levels.py``).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from ...errors import ConfigError
from ._broker import NatsBroker
from ._layout import Settings

__all__ = ["NatsBroker", "Settings", "from_url"]


def _int(options: dict[str, str], name: str, default: int, low: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(f"nats:// {name}={raw!r}: expected an integer >= {low}")
    return value


def from_url(url: str, queue: str = "default") -> NatsBroker:
    """The broker a ``nats://`` URL names (module docstring)."""
    parts = urlsplit(url)
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    auth, _, hosts = parts.netloc.rpartition("@")
    prefix = f"nats://{auth}@" if auth else "nats://"
    servers = [prefix + host for host in (hosts or "127.0.0.1:4222").split(",") if host]
    ack_wait: float | None = None
    if "ack_wait" in options:
        try:
            ack_wait = float(options["ack_wait"])
        except ValueError:
            ack_wait = -1.0
        if ack_wait <= 0:
            raise ConfigError(f"nats:// ack_wait={options['ack_wait']!r}: expected seconds > 0")
    settings = Settings(
        replicas=_int(options, "replicas", 1, 1),
        ack_wait=ack_wait,
        max_deliver=_int(options, "max_deliver", -1, -1),
        dlq_limit=_int(options, "dlq_limit", 100_000, 1),
    )
    return NatsBroker(options.get("queue") or queue, servers, settings)
