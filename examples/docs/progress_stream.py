"""Progress you can stream: follow a running job's ctx.progress updates, then its end."""

import asyncio

import aqw

app = aqw.App("memory://", queue="etl")


@app.task
async def load(rows: int, ctx: aqw.Context) -> int:
    for done in range(0, rows + 1, rows // 4):
        await ctx.progress(done / rows, f"{done} rows", {"rows": done})
    return rows


async def main() -> None:
    job_id = await load.enqueue(1000)

    async def follow() -> None:
        async for p in app.progress(job_id):
            if p.final:
                print("ended:", p.state)
            else:
                print(f"{p.fraction:.0%} {p.message} {p.detail}")

    reader = asyncio.create_task(follow())
    await app.worker(burst=True).run()
    await asyncio.wait_for(reader, 5)
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
