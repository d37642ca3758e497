"""`POST /admin/reload`: swap in a freshly loaded model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from memgnn.serving import schemas as s
from memgnn.serving.deps import Config, Eng, require_writer
from memgnn.serving.graphs import RequestError
from memgnn.serving.models import load_model

router = APIRouter(tags=["admin"])


@router.post("/admin/reload", dependencies=[Depends(require_writer)])
def reload(
    request: Request, eng: Eng, config: Config, req: s.ReloadIn | None = None
) -> dict[str, Any]:
    """Load the model again (a new export, a moved registry alias) and swap it in."""
    old = eng.version
    if req is not None and req.model is not None:
        if not config.has_writers:
            raise RequestError(
                "loading another model needs a server token", status=403, loc=("body", "model")
            )
        try:
            loaded = load_model(req.model)
        except ValueError as exc:  # the caller's model spec: missing, not a model
            raise RequestError(str(exc), loc=("body", "model")) from None
        eng.set_model(loaded)
    else:
        eng.set_model(request.app.state.load_model())
    return {"previous_version": old, "model_version": eng.version}
