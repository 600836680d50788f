"""Periodic tasks: one job per tick, however many workers run the schedule."""

import asyncio
import time

import aqw

app = aqw.App("memory://", queue="reports")
ran: list[str] = []


@app.task(schedule=aqw.Cron("0 6 * * 1-5", tz="Europe/Paris"))  # weekdays at 06:00 Paris
async def morning_report() -> None:
    ran.append("morning")


@app.task(schedule=aqw.Every(1, catch_up=3))  # every second (the shortest), epoch-aligned
async def heartbeat_check() -> None:
    ran.append(f"tick at {time.time():.1f}")


async def main() -> None:
    # Two workers on one queue: each runs a scheduler, one of them leads, and every tick is
    # enqueued with the key cron:<task>:<tick>, so the jobs are not doubled.
    async with app.worker(concurrency=4), app.worker(concurrency=4):
        await asyncio.sleep(3.2)
    print(f"{len(ran)} ticks ran:", ran)  # about 3: one job per tick, not two
    assert 1 <= len(ran) <= 4 and "morning" not in ran
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
