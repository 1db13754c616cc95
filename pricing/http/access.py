"""Who may ask what: the bearer token names the caller (auth.py), and a tenant token reaches its
own tenant's paths only. Another tenant's path is 404, the same answer as a tenant that does not
exist, given before the query is even validated."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpumeter.core.tenants import PERIOD_PATTERN
from gpumeter.core.validation import TENANT_PATTERN
from pricing.http.auth import Caller, Tokens
from pricing.http.errors import ApiError

_TENANT = re.compile(TENANT_PATTERN)

PeriodQuery = Annotated[str, Query(pattern=PERIOD_PATTERN, description="YYYY-MM (UTC)", examples=["2026-11"])]
PeriodPath = Annotated[str, Path(pattern=PERIOD_PATTERN, description="YYYY-MM (UTC)", examples=["2026-11"])]
_BEARER = HTTPBearer(auto_error=False, description="a token whose SHA-256 digest is in the tokens file")


async def _caller(request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> Caller:
    if credentials is None or not credentials.credentials:
        raise ApiError(401, "missing bearer token (Authorization: Bearer <token>)")
    tokens: Tokens = request.app.state.tokens
    found = tokens.caller(credentials.credentials)
    if found is None:
        raise ApiError(401, "unknown bearer token")
    return found


# Both dependencies are async: they never block (a digest and a dict look-up), and a sync
# dependency would cost every request a hop to the thread pool.
Authorized = Annotated[Caller, Depends(_caller)]


async def _tenant_scope(tenant: Annotated[str, Path(description="tenant name", examples=["team-a"])],
                  who: Authorized) -> str:
    # Checked before anything else about the request, so nothing hints at another tenant.
    if not who.may_see(tenant) or not _is_tenant(tenant):
        raise ApiError(404, "not found")
    return tenant


Scoped = Annotated[str, Depends(_tenant_scope)]


def _is_tenant(name: str) -> bool:
    return _TENANT.fullmatch(name) is not None
