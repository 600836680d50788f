"""Fair shares between tenants: a flood from one tenant does not queue ahead of another's."""

import asyncio

import aqw

app = aqw.App("memory://", queue="reports")
ran: list[str] = []


@app.task(fairness_key=lambda p: p["tenant"], fairness_weight=lambda p: p.get("weight", 1))
async def report(p: dict) -> None:
    ran.append(p["tenant"])


async def main() -> None:
    await report.enqueue_many([{"tenant": "acme", "n": n} for n in range(1000)])  # a flood
    await report.enqueue({"tenant": "bolt", "n": 0})  # one job, enqueued last
    await report.enqueue_many([{"tenant": "gold", "weight": 3, "n": n} for n in range(30)])

    await app.worker(concurrency=1, burst=True).run()
    print("bolt's job started as number", ran.index("bolt") + 1, "of", len(ran))
    assert ran.index("bolt") < 3  # among the next (active keys) starts, not after 1,000
    first = ran[:40]
    print("of the first 40 starts:", {t: first.count(t) for t in sorted(set(first))})
    assert abs(first.count("gold") - 3 * first.count("acme")) <= 3  # weight 3 against 1

    # a key given at enqueue, over the task's
    await report.enqueue({"tenant": "x"}, fairness_key="vip", fairness_weight=2)
    try:
        await report.enqueue({"tenant": "x"}, delay=5)
    except aqw.ConfigError as exc:
        print("refused:", exc)
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
