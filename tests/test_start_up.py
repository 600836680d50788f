"""What a process pays to start: ``import aqw``, the command line, and a whole job on the
embedded broker load no broker client they do not use (redis-py alone is about 0.2 s of
CPU, a third of a worker's start-up), and the names that need redis-py still work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Client libraries an app on memory:// never needs (croniter: only a cron schedule does).
NOT_NEEDED = ("redis", "aioboto3", "botocore", "asyncpg", "psycopg", "nats", "croniter")


def loaded_after(code: str) -> list[str]:
    """The top-level packages of ``NOT_NEEDED`` loaded after running ``code`` in a fresh
    interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import sys
        print(",".join(sorted({{m.split(".")[0] for m in sys.modules}} & set({NOT_NEEDED!r}))))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return [name for name in done.stdout.strip().split(",") if name]


def test_import_aqw_and_the_cli_load_no_broker_client() -> None:
    assert loaded_after("import aqw, aqw.cli, aqw.testing") == []


def test_a_job_on_the_embedded_broker_loads_no_broker_client() -> None:
    code = """
        import asyncio
        import aqw

        app = aqw.App("memory://")
        done = []

        @app.task
        async def hello(n: int) -> None:
            done.append(n)

        async def main() -> None:
            await hello.enqueue(1)
            async with app.worker(concurrency=2):
                while not done:
                    await asyncio.sleep(0.01)
            await app.close()

        asyncio.run(main())
        assert done == [1]
    """
    assert loaded_after(code) == []


def test_a_cron_schedule_loads_croniter_when_made() -> None:
    assert loaded_after("import aqw; aqw.Cron('*/5 * * * *').expression_problem()") == ["croniter"]


@pytest.mark.parametrize("name", ["RedisLeaseBackend", "RedlockBackend", "Cache", "CacheEntry"])
def test_the_names_that_need_redis_load_it_on_first_use(name: str) -> None:
    assert "redis" in loaded_after(f"import aqw; aqw.{name}")


def test_an_unknown_name_is_an_attribute_error() -> None:
    import aqw

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        aqw.NoSuchThing  # noqa: B018


def test_redis_errors_are_told_apart_once_the_client_is_loaded() -> None:
    from redis.exceptions import AskError, RedisError

    import aqw._redis.client
    import aqw._redis.cluster
    from aqw._redis.loaded import client_errors, cluster_redirect

    assert client_errors() == (RedisError,)
    assert "redis+cluster://10.0.0.2:7001" in (cluster_redirect(AskError("3 10.0.0.2:7001")) or "")
    assert cluster_redirect(ValueError("x")) is None
    assert client_errors() == aqw._redis.client.CLIENT_ERRORS
    assert aqw._redis.cluster.cluster_redirect is not None


def test_redis_errors_are_none_before_the_client_is_loaded() -> None:
    code = """
        from aqw._redis.loaded import client_errors, cluster_redirect
        assert client_errors() == () and cluster_redirect(ValueError("x")) is None
    """
    assert loaded_after(code) == []
