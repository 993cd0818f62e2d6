"""Exceptions of the cagebox SDK.

Every error the daemon answers carries a stable kind (the ``Error`` schema of
api/openapi.json; internal/daemon/errors.go maps the daemon's errors to it).
Each kind has a class here, so callers catch what they mean::

    try:
        sb.files.read("/nope")
    except cagebox.NotFound:
        ...
"""

from __future__ import annotations

from typing import Optional


class CageboxError(Exception):
    """Base of every SDK error.

    ``status`` is the HTTP status (0 when no answer came), ``kind`` the API's
    error kind (``not_found``, ``invalid``, ...), ``message`` the daemon's
    words, which say what to do next.
    """

    kind = ""

    def __init__(self, message: str, status: int = 0, kind: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if kind is not None:
            self.kind = kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, kind={self.kind!r}, message={self.message!r})"


class NotFound(CageboxError):
    """404: no such sandbox, secret, policy, file, tool or endpoint."""

    kind = "not_found"


class Invalid(CageboxError):
    """400: the request is malformed (bad limits, durations, policy, path)."""

    kind = "invalid"


class Unauthorized(CageboxError):
    """401: no API key, or an unknown or revoked one (TCP only)."""

    kind = "unauthorized"


class Denied(CageboxError):
    """403: the caller may not do this (an admin-only route, a floor, env mode)."""

    kind = "denied"


class Conflict(CageboxError):
    """409: the state forbids it (a revoked secret, a stale generation, a name in use)."""

    kind = "conflict"


class Unavailable(CageboxError):
    """503: a runtime or resource is not available here."""

    kind = "unavailable"


class InternalError(CageboxError):
    """500 (or 504: a deadline passed in the daemon): something failed in the daemon."""

    kind = "internal"


class ConnectionFailed(CageboxError):
    """The daemon could not be reached, or the connection broke mid-answer."""

    kind = "connection"


_BY_KIND = {c.kind: c for c in (NotFound, Invalid, Unauthorized, Denied, Conflict, Unavailable, InternalError)}
_BY_STATUS = {404: NotFound, 400: Invalid, 401: Unauthorized, 403: Denied, 409: Conflict, 503: Unavailable}


def error_for(status: int, kind: str, message: str) -> CageboxError:
    """Returns the exception for an API error answer."""
    cls = _BY_KIND.get(kind) or _BY_STATUS.get(status) or InternalError
    return cls(message, status=status, kind=kind or cls.kind)
