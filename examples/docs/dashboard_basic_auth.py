"""HTTP basic auth for the dashboard: the ``auth`` hook gets each request and says yes or
no; a "no" is a 401 with a ``WWW-Authenticate: Basic`` challenge, so browsers ask."""

import asyncio
import base64
import os
import secrets

import httpx
from starlette.requests import Request

import aqw
from aqw.dashboard import create_app

USER = os.environ.get("AQW_DASHBOARD_USER", "ops")
PASSWORD = os.environ.get("AQW_DASHBOARD_PASSWORD", "change me")


def basic_auth(request: Request) -> bool:
    """True when the request carries the right user and password."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(encoded).decode().partition(":")
    except ValueError:
        return False
    # compare_digest: the time taken does not tell how much of a guess was right
    return secrets.compare_digest(user, USER) & secrets.compare_digest(password, PASSWORD)


web = create_app(aqw.App("memory://", queue="dashboard-auth"), auth=basic_auth)


async def main() -> None:
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://web") as client:
        print((await client.get("/")).status_code)  # 401
        print((await client.get("/", auth=(USER, PASSWORD))).status_code)  # 200


asyncio.run(main())
