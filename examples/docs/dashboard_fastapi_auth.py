"""Reuse a FastAPI dependency's check for the dashboard. FastAPI does not run dependencies
for a mounted app, so the ``auth`` hook calls the same function the dependency uses."""

import asyncio
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request

import aqw
from aqw.dashboard import create_app

TOKENS = {"s3cret": "alice"}  # your session store or identity provider


async def current_user(request: Request) -> str | None:
    """The user a request is from: here a bearer token, looked up."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return TOKENS.get(token) if scheme.lower() == "bearer" else None


async def require_user(user: Annotated[str | None, Depends(current_user)]) -> str:
    """The dependency your own routes use."""
    if user is None:
        raise HTTPException(401, "sign in first")
    return user


async def dashboard_auth(request: Request) -> bool:
    """The dashboard's hook: the same check, answering yes or no."""
    return await current_user(request) is not None


jobs = aqw.App("memory://", queue="dashboard-deps")
api = FastAPI()
api.mount("/aqw", create_app(jobs, auth=dashboard_auth))


@api.get("/me")
async def me(user: Annotated[str, Depends(require_user)]) -> dict[str, str]:
    return {"user": user}


async def main() -> None:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://web") as client:
        token = {"authorization": "Bearer s3cret"}
        print((await client.get("/aqw/")).status_code)  # 401
        print((await client.get("/aqw/", headers=token)).status_code)  # 200
        print((await client.get("/me", headers=token)).json())  # {'user': 'alice'}


asyncio.run(main())
