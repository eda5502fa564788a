"""What the SDK's RestClient lists: the caller's training runs (live models, and released ones
whose checkpoints remain) and their checkpoints, read from the model table and the checkpoint
store; nothing here changes either.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rollway.gateway.callers import owns
from rollway.gateway.checkpoints import CheckpointStore
from rollway.gateway.errors import not_found
from rollway.gateway.models import ModelTable


def cursor(offset: int, limit: int, total: int) -> dict:
    return {"offset": offset, "limit": limit, "total_count": total}


class TrainingRuns:
    """The caller's training runs and checkpoints, as the SDK's RestClient reads them."""

    def __init__(self, models: ModelTable, saved: CheckpointStore):
        self.models = models
        self.saved = saved

    def training_runs(self) -> list[dict]:
        tenants = self.models.all()
        return [self.training_run(t.spec.model_id) for t in tenants if owns(t.spec.owner)]

    def training_run(self, model_id: str) -> dict:
        """A live model, or a released one whose checkpoints remain."""
        tenant = self.models.find(model_id)
        saved = self.saved.of_model(model_id)
        spec = (
            tenant.spec
            if tenant is not None
            else next((sp for c, sp in self.saved.all() if sp.model_id == model_id), None)
        )
        if spec is None or not owns(spec.owner):
            raise not_found(
                f"model_id: {model_id!r} is not a model of this gateway (released or never created)"
            )
        last = {
            kind: next((c for c in reversed(saved) if c.kind == kind), None)
            for kind in ("weights", "sampler_weights")
        }
        last_request = (
            tenant.last_request_time if tenant is not None else max((c.time for c in saved), default=None)
        )
        return {
            "training_run_id": model_id,
            "base_model": spec.base_model,
            "model_owner": spec.session_id,
            "is_lora": bool(spec.lora_rank),
            "lora_rank": spec.lora_rank or None,
            "last_request_time": (last_request or datetime.now(UTC)).isoformat(),
            "last_checkpoint": last["weights"] and last["weights"].json(),
            "last_sampler_checkpoint": last["sampler_weights"] and last["sampler_weights"].json(),
            "user_metadata": spec.user_metadata or None,
        }

    def checkpoints(self, model_id: str) -> list[dict]:
        self.training_run(model_id)  # not_found for another tenant's or an unknown model
        return [c.json() for c in self.saved.of_model(model_id)]

    def user_checkpoints(self, limit: int, offset: int) -> dict:
        """The caller's checkpoints of every model, newest first, paginated."""
        mine = sorted(
            (c for c, spec in self.saved.all() if owns(spec.owner)), key=lambda c: c.time, reverse=True
        )
        page = mine[offset : offset + limit]
        return {"checkpoints": [c.json() for c in page], "cursor": cursor(offset, limit, len(mine))}
