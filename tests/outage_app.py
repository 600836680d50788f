"""An app for the command-line tests of tests/test_outages.py (``outage_app:app``); they
point it at a broker with ``--broker``."""

from __future__ import annotations

import aqw

app = aqw.App("memory://", queue="outage")


@app.task(name="work")
async def work(n: int) -> None:
    return None
