"""Typed API errors, decoded from the `Status` object the API server sends with every failure.

Callers branch on *what* went wrong (`except Conflict:` retry, `except NotFound:` treat as
absent), never on numbers, so every status code the rest of the project reacts to gets its own
class. The decoded `Status` rides along for logs and for details like `causes`.

Decisions:
- `AlreadyExists` is *not* a `Conflict`, although both are HTTP 409: a `Conflict` means "your
  resourceVersion is stale, re-read and retry", an `AlreadyExists` means "the name is taken";
  a retry loop catching `Conflict` must not silently swallow a create that lost a race.
- The class follows the HTTP code; `Status.reason` only refines the one ambiguous code (409).
  Reasons alone are not trusted: a 410 arrives as reason "Expired" or "Gone" depending on the
  code path, and some error paths leave the reason empty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ConfigError(Exception):
    """No usable configuration, or one that asks for something we do not support. Its text is
    one line the user acts on (the CLI prints it as the command's error)."""


class ApiError(Exception):
    """An error answer from the API server (or an ERROR event in a watch stream)."""

    def __init__(self, code: int, reason: str, message: str, status: Mapping[str, Any]) -> None:
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status: Mapping[str, Any] = status

    @property
    def details(self) -> Mapping[str, Any]:
        details = self.status.get("details")
        return details if isinstance(details, Mapping) else {}


class BadRequest(ApiError):
    """400: malformed request (bad selector, bad patch body...)."""


class Unauthorized(ApiError):
    """401: no or bad credentials."""


class Forbidden(ApiError):
    """403: authenticated but RBAC (or admission) says no."""


class NotFound(ApiError):
    """404: the object (or the resource type) does not exist."""


class MethodNotAllowed(ApiError):
    """405: e.g. a verb the resource does not support."""


class Conflict(ApiError):
    """409: optimistic concurrency failed (stale resourceVersion) or an apply conflict."""


class AlreadyExists(ApiError):
    """409 with reason AlreadyExists: create of a name that is taken."""


class Gone(ApiError):
    """410: the resourceVersion (or continue token) is too old; relist from scratch."""


class Invalid(ApiError):
    """422: the object failed validation; `causes` says which fields and why."""

    @property
    def causes(self) -> list[Mapping[str, Any]]:
        causes = self.details.get("causes")
        return [c for c in causes if isinstance(c, Mapping)] if isinstance(causes, list) else []


class TooManyRequests(ApiError):
    """429: throttled (or an eviction refused by a PodDisruptionBudget)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        status: Mapping[str, Any],
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, reason, message, status)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx: the server failed; usually worth a retry with backoff."""


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def _error_class(code: int, reason: str) -> type[ApiError]:
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if code in _BY_CODE:
        return _BY_CODE[code]
    return ServerError if code >= 500 else ApiError


def error_from_status(
    status: Mapping[str, Any], *, http_code: int | None = None, retry_after: float | None = None
) -> ApiError:
    """The typed exception for a decoded `Status` (watch ERROR events carry only this).

    `http_code` is the response's code; it wins when the body's `code` is missing (some proxies
    and non-Status error bodies).
    """
    raw_code = status.get("code")
    code = raw_code if isinstance(raw_code, int) and raw_code > 0 else (http_code or 500)
    if http_code is not None and http_code >= 400:
        code = http_code
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or "")
    cls = _error_class(code, reason)
    if cls is TooManyRequests:
        return TooManyRequests(code, reason, message, status, retry_after)
    return cls(code, reason, message, status)


def error_from_response(
    http_code: int, body: bytes | str, *, retry_after: str | None = None
) -> ApiError:
    """Decode an error response body (usually a `Status`, sometimes plain text) into an error."""
    status: Mapping[str, Any]
    try:
        decoded = json.loads(body) if body else {}
    except ValueError:
        decoded = None
    if isinstance(decoded, Mapping) and decoded.get("kind", "Status") == "Status":
        status = decoded
    else:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        status = {"kind": "Status", "status": "Failure", "code": http_code, "message": text}
    return error_from_status(status, http_code=http_code, retry_after=_retry_after(retry_after))


def _retry_after(header: str | None) -> float | None:
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        return None  # an HTTP date; the API server only ever sends seconds
