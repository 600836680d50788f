"""Limits on what enqueue accepts: the encoded-job size cap (``max_payload_bytes``), and
broker URL options reaching redis-py with the values written (``split_queue``, ``sqs://``)."""

from __future__ import annotations

import pytest
from conftest import Backend
from pydantic import BaseModel
from redis import Redis

import aqw
from aqw.brokers import from_url
from aqw.brokers.redis import split_queue
from tests._helpers import depth

pytestmark = pytest.mark.timeout(60)

MiB = 1_048_576


class Upload(BaseModel):
    name: str
    data: str


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# -- max_payload_bytes at enqueue --------------------------------------------------------------


async def test_an_oversize_payload_is_refused_and_nothing_is_written(backend: Backend) -> None:
    app = backend.app(max_payload_bytes=2_000)

    @app.task(name="store_upload")
    async def store_upload(upload: Upload) -> None:
        pass

    with pytest.raises(aqw.PayloadTooLarge) as err:
        await store_upload.enqueue(Upload(name="big", data="x" * 5_000))
    message = one_line(err.value)
    assert "'store_upload'" in message
    assert f"{err.value.size} bytes" in message and "2000" in message
    assert err.value.task == "store_upload"
    assert err.value.limit == 2_000
    assert 5_000 < err.value.size < 5_400  # the whole envelope, not the payload alone
    assert await depth(app) == (0, 0, 0, 0)

    # a payload under the cap goes through
    await store_upload.enqueue(Upload(name="small", data="x" * 1_000))
    assert await depth(app) == (1, 0, 0, 0)


async def test_the_default_cap_is_one_mebibyte_of_encoded_job() -> None:
    app = aqw.App("memory://")
    assert app.max_payload_bytes == MiB
    assert app.payload_limit(None) == MiB

    @app.task(name="blob")
    async def blob(data: str) -> None:
        pass

    with pytest.raises(aqw.PayloadTooLarge) as err:
        await blob.enqueue("x" * MiB)  # the payload alone fits; the envelope does not
    assert err.value.limit == MiB and err.value.size > MiB
    assert "1048576" in str(err.value)
    await blob.enqueue("x" * (MiB - 1_000))
    assert await depth(app) == (1, 0, 0, 0)
    await app.close()


async def test_the_cap_measures_the_whole_envelope_headers_included() -> None:
    app = aqw.App("memory://", max_payload_bytes=1_200)

    @app.task(name="note")
    async def note(text: str) -> None:
        pass

    await note.enqueue("x" * 900)  # fits with the envelope around it
    with pytest.raises(aqw.PayloadTooLarge):
        await note.enqueue("x" * 900, headers={"h": "y" * 300})  # headers count
    with pytest.raises(aqw.PayloadTooLarge):
        await note.enqueue("x" * 1_150)  # under the cap as JSON, over it as a job
    assert await depth(app) == (1, 0, 0, 0)
    await app.close()


async def test_a_tasks_cap_overrides_the_apps(backend: Backend) -> None:
    app = backend.app(max_payload_bytes=1_000)

    @app.task(name="roomy", max_payload_bytes=20_000)
    async def roomy(data: str) -> None:
        pass

    @app.task(name="tight", max_payload_bytes=500)
    async def tight(data: str) -> None:
        pass

    @app.task(name="inherits")
    async def inherits(data: str) -> None:
        pass

    assert roomy.options.max_payload_bytes == 20_000
    assert inherits.options.max_payload_bytes == 1_000
    assert app.payload_limit("roomy") == 20_000
    assert app.payload_limit("tight") == 500
    assert app.payload_limit("inherits") == 1_000
    assert app.payload_limit("not-a-task") == 1_000
    assert app.payload_limit(None) == 1_000

    await roomy.enqueue("x" * 10_000)
    with pytest.raises(aqw.PayloadTooLarge, match="'inherits'"):
        await inherits.enqueue("x" * 10_000)
    with pytest.raises(aqw.PayloadTooLarge, match=r"'tight'.* of 500"):
        await tight.enqueue("x" * 600)  # under the app's cap, over the task's
    with pytest.raises(aqw.PayloadTooLarge, match="'inherits'"):
        await app.enqueue("inherits", ["x" * 10_000])  # by name, through the app
    assert await depth(app) == (1, 0, 0, 0)


async def test_no_app_cap_still_honours_a_tasks_cap() -> None:
    app = aqw.App("memory://", max_payload_bytes=None)

    @app.task(name="free")
    async def free(data: str) -> None:
        pass

    @app.task(name="capped", max_payload_bytes=1_000)
    async def capped(data: str) -> None:
        pass

    assert app.payload_limit(None) is None and app.payload_limit("free") is None
    await free.enqueue("x" * (2 * MiB))
    with pytest.raises(aqw.PayloadTooLarge, match="'capped'"):
        await capped.enqueue("x" * 2_000)
    assert await depth(app) == (1, 0, 0, 0)
    await app.close()


async def test_enqueue_many_refuses_the_whole_batch(backend: Backend) -> None:
    app = backend.app(max_payload_bytes=1_000)

    @app.task(name="batch")
    async def batch(data: str) -> None:
        pass

    with pytest.raises(aqw.PayloadTooLarge) as err:
        await batch.enqueue_many(["a", "b", "x" * 2_000, "c"])
    assert "'batch'" in one_line(err.value)
    assert "payload 3 of 4" in str(err.value)
    with pytest.raises(aqw.PayloadTooLarge):
        await batch.enqueue_many(["a", "x" * 2_000], delay=60)
    assert await depth(app) == (0, 0, 0, 0)
    assert len(await batch.enqueue_many(["a", "b"])) == 2
    assert await depth(app) == (2, 0, 0, 0)


async def test_a_refused_delayed_or_keyed_job_leaves_no_trace(backend: Backend) -> None:
    app = backend.app(max_payload_bytes=1_000)

    @app.task(name="later")
    async def later(data: str) -> None:
        pass

    with pytest.raises(aqw.PayloadTooLarge):
        await later.enqueue("x" * 2_000, delay=60)
    with pytest.raises(aqw.PayloadTooLarge):
        await later.enqueue("x" * 2_000, key="k1")
    assert await depth(app) == (0, 0, 0, 0)
    # the key was not taken by the refused job
    job = await later.enqueue("small", key="k1")
    assert not job.duplicate
    assert await depth(app) == (1, 0, 0, 0)


def test_payload_too_large_is_a_value_error_not_a_config_error() -> None:
    assert issubclass(aqw.PayloadTooLarge, aqw.AqwError)
    assert issubclass(aqw.PayloadTooLarge, ValueError)
    assert not issubclass(aqw.PayloadTooLarge, aqw.ConfigError)
    assert "PayloadTooLarge" in aqw.__all__


@pytest.mark.parametrize("bad", [0, -1, 1.5, 1000.0, True, "1024"])
def test_bad_caps_are_config_errors_naming_the_argument(bad: object) -> None:
    with pytest.raises(aqw.ConfigError, match="App max_payload_bytes"):
        aqw.App("memory://", max_payload_bytes=bad)  # type: ignore[arg-type]
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError, match="task 'bad_cap': max_payload_bytes"):

        @app.task(name="bad_cap", max_payload_bytes=bad)  # type: ignore[arg-type]
        async def bad_cap() -> None:
            pass

    assert "bad_cap" not in app.tasks


def test_redact_errors_must_be_a_bool() -> None:
    with pytest.raises(aqw.ConfigError, match="redact_errors"):
        aqw.App("memory://", redact_errors="no")  # type: ignore[arg-type]
    assert aqw.App("memory://").redact_errors is True
    assert aqw.App("memory://", redact_errors=False).redact_errors is False


# -- broker URL options reach redis-py as written ---------------------------------------------


def redis_kwargs(url: str) -> dict[str, object]:
    """The connection kwargs redis-py makes of ``url`` (nothing connects)."""
    client = Redis.from_url(url)
    try:
        return dict(client.connection_pool.connection_kwargs)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ssl_ca_certs=/etc/a+b/ca.pem", "/etc/a+b/ca.pem"),  # a bare + is a plus
        ("ssl_ca_certs=/etc/a%2Bb/ca.pem", "/etc/a+b/ca.pem"),
        ("ssl_ca_certs=/etc/my%20certs/ca.pem", "/etc/my certs/ca.pem"),
        ("ssl_ca_certs=/etc/my certs/ca.pem", "/etc/my certs/ca.pem"),
        ("ssl_ca_certs=/etc/a%26b=c/ca.pem", "/etc/a&b=c/ca.pem"),
        ("ssl_ca_certs=/etc/100%25/ca.pem", "/etc/100%/ca.pem"),
        ("ssl_ca_certs=/etc/%2520/ca.pem", "/etc/%20/ca.pem"),  # decoded once, not twice
    ],
)
@pytest.mark.parametrize("queue_at", ["start", "end", "none"])
def test_split_queue_hands_redis_py_the_values_written(
    query: str, expected: str, queue_at: str
) -> None:
    full = {
        "start": f"queue=jobs&{query}&db=3",
        "end": f"{query}&db=3&queue=jobs",
        "none": f"{query}&db=3",
    }[queue_at]
    plain, queue = split_queue(f"rediss://cache.internal:6380/1?{full}", "dflt")
    assert queue == ("dflt" if queue_at == "none" else "jobs")
    assert "queue" not in plain
    kwargs = redis_kwargs(plain)
    assert kwargs["ssl_ca_certs"] == expected
    assert kwargs["db"] == 3  # the option after it is still its own option
    assert kwargs["host"] == "cache.internal" and kwargs["port"] == 6380


def test_split_queue_keeps_order_blank_values_and_the_rest_of_the_url() -> None:
    plain, queue = split_queue(
        "redis://user:p%40ss%2Bw@h:6379/2?client_name=&queue=a&socket_timeout=5&queue=b", "d"
    )
    assert queue == "b"  # the last one, as before
    assert plain == "redis://user:p%40ss%2Bw@h:6379/2?client_name=&socket_timeout=5"
    kwargs = redis_kwargs(plain)
    assert kwargs["password"] == "p@ss+w" and kwargs["username"] == "user"
    assert kwargs["socket_timeout"] == 5.0 and kwargs["db"] == 2
    assert split_queue("redis://h:6379/0", "d") == ("redis://h:6379/0", "d")
    assert split_queue("redis://h:6379/0?queue=q", "d") == ("redis://h:6379/0", "q")


def test_split_queue_keeps_a_unix_socket_url() -> None:
    plain, queue = split_queue("unix:///run/redis/redis.sock?db=4&queue=q", "d")
    assert (plain, queue) == ("unix:///run/redis/redis.sock?db=4", "q")
    kwargs = redis_kwargs(plain)
    assert kwargs["path"] == "/run/redis/redis.sock" and kwargs["db"] == 4


async def test_an_app_on_a_rediss_url_gets_the_certificate_path_written() -> None:
    app = aqw.App("rediss://127.0.0.1:6380/0?ssl_ca_certs=/etc/a+b/c%2Bd%20e.pem&queue=q1")
    try:
        assert app.queue == "q1"
        client = app.broker.client  # type: ignore[attr-defined]
        assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == "/etc/a+b/c+d e.pem"
    finally:
        await app.close()


def test_sqs_options_keep_a_plus_and_pass_the_locks_url_to_redis_py_as_written() -> None:
    broker = from_url(
        "sqs://jobs?region=us-east-1&task=import+users"
        "&locks=rediss://locks.internal:6380/2?ssl_ca_certs=/etc/a+b/c%2Bd%20e.pem%26db=5"
    )
    assert broker.default_task == "import+users"  # type: ignore[attr-defined]
    lock_url = broker.lock_url  # type: ignore[attr-defined]
    kwargs = redis_kwargs(lock_url)
    assert kwargs["ssl_ca_certs"] == "/etc/a+b/c+d e.pem"
    assert kwargs["db"] == 5
    assert kwargs["host"] == "locks.internal"
