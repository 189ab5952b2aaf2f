"""Many clients waiting on ``?wait=60`` at once, for the waits test and benchmark figure 11."""

from __future__ import annotations

import asyncio
import threading

import httpx


def wait_in_background(url: str, sessions: list[str], count: int) -> threading.Thread:
    """``count`` clients in one thread, each submitting to one of ``sessions`` with ``?wait=60``.

    The clients of one session share an Idempotency-Key, so each session gets one queued turn
    however many wait on it. The thread ends when every wait has been answered.
    """

    async def waiter(client: httpx.AsyncClient, index: int) -> None:
        sid = sessions[index % len(sessions)]
        await client.post(
            f"/v1/sessions/{sid}/turns?wait=60",
            json={"message": "never worked on"},
            headers={"Idempotency-Key": f"k-{sid}"},
        )

    async def main() -> None:
        limits = httpx.Limits(max_connections=count + 50, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(waiter(client, i) for i in range(count)), return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    return thread
