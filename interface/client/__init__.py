"""A Python client of the HTTP API: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Exported as ``turnlog.Client`` and ``turnlog.AsyncClient``; it needs httpx and
pydantic only, never the server's packages.
"""

from turnlog.interface.client.aio import AsyncClient
from turnlog.interface.client.calls import RetryPolicy
from turnlog.interface.client.errors import (
    ApiError,
    NotATurnlogServer,
    ServerUnreachable,
    TurnlogError,
    TurnWaitTimeout,
)
from turnlog.interface.client.sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "NotATurnlogServer",
    "RetryPolicy",
    "ServerUnreachable",
    "TurnWaitTimeout",
    "TurnlogError",
]
