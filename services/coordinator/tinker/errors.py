"""Refusals in the shapes the tinker SDK reads.

A refused HTTP call answers {"error": ..., "category": "user"|"server"} with a status the SDK
maps to an exception (400 BadRequestError, 401, 404, 409, 429 RateLimitError). A failed future
answers RequestFailedResponse ({"error", "category"}); one that may succeed if repeated (its
trainer died and restarts) answers HTTP 410, which the SDK raises as its retryable error.
"""

from __future__ import annotations


class GatewayError(Exception):
    """A call refused with an HTTP status and a message naming what is wrong."""

    def __init__(self, status: int, message: str, category: str = "user"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.category = category


def bad_request(message: str) -> GatewayError:
    return GatewayError(400, message)


def not_found(message: str) -> GatewayError:
    return GatewayError(404, message)


class RetryableFailure(Exception):
    """A call that failed because its service died; the SDK may repeat it (HTTP 410)."""
