"""What a handler knows about its job (ctx), and how to watch a running job from outside."""

import asyncio

import aqw

app = aqw.App("memory://", queue="reports")
release = asyncio.Event()


@app.task(lease_ttl=10.0, sla=60.0)
async def build_report(report_id: int, ctx: aqw.Context) -> None:
    print(
        f"job {ctx.job_id}: task={ctx.task} attempt={ctx.attempt} fencing_token={ctx.fencing_token}"
    )
    await ctx.progress(0.5, "half way")
    await release.wait()  # stand-in for real work


async def main() -> None:
    async with app.worker(concurrency=4):  # runs in the background of this block
        job_id = await build_report.enqueue(7)
        info = await app.job(job_id)
        while info is None or info.progress != 0.5:
            await asyncio.sleep(0.05)
            info = await app.job(job_id)
        print("running:", info.state, info.task, info.attempts, info.progress, info.message)
        release.set()
        await app.result(job_id, timeout=10)  # waits for the end, without polling
    info = await app.job(job_id)
    assert info is not None
    print("finished:", info.state, "at", info.finished_at)  # succeeded
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
