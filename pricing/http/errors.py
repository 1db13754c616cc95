"""Every failure answers ``{"error": "<one reason>"}``: 400 for a malformed parameter, 401 without
a known token, 404 for what does not exist or belongs to another tenant."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

REASONS = {
    "period": "period must be YYYY-MM (e.g. 2026-11)",
    "format": "format must be json, csv or pdf",
    "paper": "paper must be A4 or Letter",
}


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _reason(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail).lower()}, status_code=exc.status_code)


def _reason(exc: RequestValidationError) -> str:
    """One clear reason for the first invalid parameter."""
    for error in exc.errors():
        location = [str(part) for part in error.get("loc", ())]
        name = location[-1] if location else "request"
        if name in REASONS:
            return REASONS[name]
        return f"{name}: {error.get('msg', 'invalid')}"
    return "invalid request"
