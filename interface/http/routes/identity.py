"""``GET /v1/whoami``: the namespace and role a request's token reaches."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from turnlog.application.tenants import Grant
from turnlog.interface.http.schemas import problems
from turnlog.interface.http.tenancy import Tenancy

router = APIRouter(prefix="/v1", tags=["identity"])


class WhoamiOut(BaseModel):
    """What the presented token reaches."""

    namespace: str = Field(description="The namespace this request reached.")
    role: str = Field(description="reader, client, operator or admin.")
    token: str | None = Field(
        description="The token's name in the tenants file (None without one)."
    )
    namespaces: list[str] = Field(
        description="Namespaces the token can reach (an admin's: every one served;"
        " pick one with the X-Turnlog-Namespace header)."
    )
    quotas: dict[str, int] = Field(description="The namespace's quotas (those that are set).")


@router.get("/whoami", response_model=WhoamiOut, responses=problems(401))
async def whoami(request: Request) -> WhoamiOut:
    """The namespace and role of the request's token, and the namespace's quotas.

    Without a tenants file the one token (or none) may do everything in the
    server's one namespace: the role is `admin`.
    """
    tenancy: Tenancy = request.app.state.tenancy
    grant: Grant | None = request.scope.get("state", {}).get("grant")
    namespace: str = request.scope.get("state", {}).get("namespace") or tenancy.default
    if grant is None or tenancy.tenants is None:
        return WhoamiOut(
            namespace=namespace, role="admin", token=None, namespaces=[namespace], quotas={}
        )
    return WhoamiOut(
        namespace=namespace,
        role=str(grant.access),
        token=grant.name,
        namespaces=tenancy.reachable(grant),
        quotas=tenancy.tenants.quotas_of(namespace).set(),
    )
