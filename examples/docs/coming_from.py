"""A Celery-style task ported to aqw: a typed payload, retries, a delayed enqueue."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="imports")  # "redis://..." or "sqs://..." in production
imported: list[str] = []


class ImportFile(BaseModel):
    file_id: str


@app.task(max_retries=5, retry=aqw.RetryPolicy(base=10.0), timeout=300.0)
async def import_file(data: ImportFile, ctx: aqw.Context) -> None:
    ctx.log.info("importing %s (attempt %d)", data.file_id, ctx.attempt)
    imported.append(data.file_id)  # write with fence=ctx.fencing_token


async def main() -> None:
    await import_file.enqueue(ImportFile(file_id="a"), delay=60.0)  # Celery's countdown=60
    await import_file.enqueue(ImportFile(file_id="b"))  # Celery's .delay("b")
    async with app.worker(burst=True) as worker:  # `aqw worker module:app` in production
        await worker.wait_stopped()
    assert imported == ["b"]  # "a" is due in a minute: still delayed
    assert (await app.broker.depth()).delayed == 1
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
