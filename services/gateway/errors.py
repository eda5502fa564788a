"""Refusals in the shapes the tinker SDK reads.

A refused HTTP call answers {"error": ..., "category": "user"|"server"} with a status the SDK
maps to an exception (400 BadRequestError, 401, 404, 409, 429 RateLimitError). A failed future
answers RequestFailedResponse ({"error", "category"}), which the SDK raises as RequestFailedError
with the message as written: a conflict or a refusal of the model's (category user), a trainer that
died (category server, saying what was restored). HTTP 410 is not used: the SDK replaces its body
with "Promise expired/broken".

One shape per kind of mistake: what the request itself gets wrong (a field's type or value, an
unknown or unsupported loss or optimizer, a sequence over the context) is refused at once with
400 naming the field; what only the model can check (the trainer's ranges, a datum's targets)
fails the call's future, naming the field too.
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


def conflict(message: str) -> GatewayError:
    """409-style: the request conflicts with what exists (raised in a future: the SDK retries an
    HTTP 409 for minutes, and reads a failed future at once)."""
    return GatewayError(409, message)


class TrainerRestarted(GatewayError):
    """A call lost because its model's trainer died: it was restarted from `restored` (a
    SavedCheckpoint, or None: the base model), and the calls since that save are lost."""

    def __init__(self, model_id: str, restored):
        if restored is None:
            origin = "the base model (the model saved no state before), so every step so far is lost"
        else:
            origin = (
                f"its last save {restored.tinker_path} (saved {restored.time.isoformat(timespec='seconds')}); "
                "the steps after that save are lost"
            )
        super().__init__(
            503, f"the trainer of {model_id} died during this call; it was restarted and loaded {origin}. "
            "Repeat the call (and the steps since that save) to continue", "server",
        )  # fmt: skip
