"""Status bodies -> typed errors: the mapping every `except NotFound:` in the project relies on."""

from __future__ import annotations

import json

import pytest

from akri_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    MethodNotAllowed,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    error_from_response,
    error_from_status,
)


def status(code: int, reason: str, message: str = "m", **details: object) -> dict[str, object]:
    body: dict[str, object] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    if details:
        body["details"] = details
    return body


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (405, "MethodNotAllowed", MethodNotAllowed),
        (409, "Conflict", Conflict),
        (409, "AlreadyExists", AlreadyExists),
        (410, "Gone", Gone),
        (410, "Expired", Gone),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", ServerError),
        (503, "ServiceUnavailable", ServerError),
        (504, "Timeout", ServerError),
        (418, "", ApiError),
    ],
)
def test_code_and_reason_pick_the_class(code: int, reason: str, cls: type[ApiError]) -> None:
    err = error_from_response(code, json.dumps(status(code, reason, "why")).encode())
    assert type(err) is cls
    assert (err.code, err.reason, err.message) == (code, reason, "why")
    assert err.status["kind"] == "Status"


def test_already_exists_is_not_a_conflict() -> None:
    # A retry loop on Conflict must not swallow a lost create race.
    err = error_from_status(status(409, "AlreadyExists"))
    assert not isinstance(err, Conflict)


def test_reason_alone_does_not_override_the_code() -> None:
    assert type(error_from_status(status(500, "AlreadyExists"))) is ServerError


def test_invalid_carries_causes() -> None:
    causes = [{"reason": "FieldValueRequired", "field": "spec.x", "message": "Required value"}]
    err = error_from_response(
        422, json.dumps(status(422, "Invalid", name="w", kind="Widget", causes=causes))
    )
    assert isinstance(err, Invalid)
    assert err.causes == causes
    assert err.details["name"] == "w"


def test_invalid_without_details_has_no_causes() -> None:
    err = error_from_status(status(422, "Invalid"))
    assert isinstance(err, Invalid) and err.causes == []


def test_too_many_requests_retry_after() -> None:
    err = error_from_response(429, json.dumps(status(429, "TooManyRequests")), retry_after="3")
    assert isinstance(err, TooManyRequests) and err.retry_after == 3.0
    err = error_from_response(429, b"", retry_after="Wed, 21 Oct 2015 07:28:00 GMT")
    assert isinstance(err, TooManyRequests) and err.retry_after is None


def test_plain_text_body_keeps_the_http_code_and_text() -> None:
    err = error_from_response(403, b"forbidden: go away")
    assert isinstance(err, Forbidden)
    assert err.message == "forbidden: go away"


def test_http_code_wins_over_a_missing_or_odd_body_code() -> None:
    assert isinstance(error_from_response(404, json.dumps({"kind": "Status"})), NotFound)
    assert isinstance(error_from_response(404, b"{}"), NotFound)


def test_watch_error_event_status_without_http_code() -> None:
    # The ERROR event of an expired watch: 200 on the wire, the code lives in the object.
    err = error_from_status(
        {
            "kind": "Status",
            "status": "Failure",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version: 1 (200)",
        }
    )
    assert isinstance(err, Gone)
    assert "too old" in str(err)


def test_status_without_code_defaults_to_server_error() -> None:
    assert isinstance(error_from_status({"kind": "Status", "message": "?"}), ServerError)
