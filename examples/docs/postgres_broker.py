"""A queue in PostgreSQL: no Redis at all.

Needs PostgreSQL (asyncpg): AQW_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test).
"""

import asyncio
import os
import uuid

import asyncpg

import aqw

DSN = os.environ.get("AQW_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = f"docs_pg_{uuid.uuid4().hex[:8]}"  # default: aqw

app = aqw.App(f"{DSN}?schema={SCHEMA}", queue="emails")
sent: list[str] = []


@app.task(max_retries=2)
async def send(to: str) -> None:
    sent.append(to)


async def main() -> None:
    try:
        await send.enqueue_many(["ada@example.com", "bob@example.com"])
        await send.enqueue("later@example.com", delay=0.2)
        # The tables are made (versioned) when the broker connects; aqw db migrate too.
        await app.worker(burst=True).run()
        while len(sent) < 3:  # the delayed one, once due
            await app.worker(burst=True).run()
        print("sent:", sorted(sent))
        print("depth:", (await app.broker.depth()).as_dict())
    finally:
        await app.close()
        conn = await asyncpg.connect(DSN)
        await conn.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
        await conn.close()


asyncio.run(main())
