"""`explain(ExplainRequest, backend) -> ExplainAnswer`: what holds the simulated peak, and
what each change would save.

The run is the one `predict` answers (the same model, training spec, sizes and device;
`method` replay: the simulator's exact bytes). Its peak moment comes from replaying the
captured step through the allocator (`predictor.sim.live.peak_moment`), every block live
then is named (`predictor.answer.attribute`): by module path, by the source line that
made it, by aten op, by category (parameters, gradients, optimizer state, saved
activations, temporaries, the cuBLAS workspaces, kernel scratch), by module across layers
(`model.layers.*.mlp.down_proj`: one row for every block's), the largest with shape,
dtype, bytes and why each is alive. The what-ifs (`predictor.answer.whatif`) are each a
replay of the changed run, ranked by bytes saved. `timeline`: allocated and reserved
bytes over the replayed path's events with its phase spans (`predictor.sim.live.step_timeline`;
None on the CPU), what `memgnn explain --html` draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from memgnn.predictor.answer.attribute import blocks_at, group, node_modules
from memgnn.predictor.answer.backend import Backend
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.runconfig import apply_run_config
from memgnn.predictor.answer.types import Answer, ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.answer.whatif import WHATIFS, run_whatifs
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.sources import node_sources
from memgnn.predictor.sim.live import peak_moment, step_timeline
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["ExplainAnswer", "ExplainRequest", "explain"]

MAX_TOP = 1000


@dataclass(kw_only=True, slots=True)
class ExplainRequest:
    """One run to explain: a model SPEC with its training spec (or a stored `graph_id`:
    then only the allocator what-if, the others need a capture) and one config (sizes,
    device, metric, scenario). `top`: rows per table; `whatifs`: which to answer (None:
    all of `WHATIFS`; empty: none). `run_config`/`explicit` as in `PredictRequest`."""

    config: QueryConfig = field(default_factory=QueryConfig)
    model: ModelRef | None = None
    train: TrainSpec = field(default_factory=TrainSpec)
    graph_id: str | None = None
    top: int = 15
    whatifs: tuple[str, ...] | None = None
    run_config: Any = None
    explicit: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        given = [n for n in ("model", "graph_id") if getattr(self, n) is not None]
        if self.run_config is not None and not given:
            given = ["config"]
        if len(given) != 1:
            raise UserError(f"give exactly one of model, graph_id (got {given or 'none'})")
        if not 1 <= self.top <= MAX_TOP:
            raise UserError(f"top must be in 1..{MAX_TOP}, got {self.top}", loc=("top",))
        for name in self.whatifs or ():
            if name not in WHATIFS:
                raise UserError(f"unknown what-if {name!r}; expected some of {WHATIFS}",
                                loc=("whatifs",))  # fmt: skip


@dataclass(kw_only=True, slots=True)
class ExplainAnswer:
    """The peak and who holds it (see the module docstring); `prediction` is the answer
    `memgnn predict --method replay` gives for the same run, `assumptions` what the
    naming assumed."""

    prediction: Answer
    peak: dict[str, Any]
    by_category: list[dict[str, Any]]
    by_module: list[dict[str, Any]]
    by_layer_module: list[dict[str, Any]]
    by_source: list[dict[str, Any]]
    by_op: list[dict[str, Any]]
    largest: list[dict[str, Any]]
    whatifs: list[dict[str, Any]]
    not_applicable: list[dict[str, str]]
    assumptions: list[str]
    timeline: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prediction": self.prediction.to_dict(),
            "peak": self.peak,
            "by_category": self.by_category,
            "by_module": self.by_module,
            "by_layer_module": self.by_layer_module,
            "by_source": self.by_source,
            "by_op": self.by_op,
            "largest": self.largest,
            "whatifs": self.whatifs,
            "not_applicable": self.not_applicable,
            "assumptions": self.assumptions,
            "timeline": self.timeline,
        }


def explain(req: ExplainRequest, backend: Backend) -> ExplainAnswer:
    """Explain the peak of `req`'s run (see the module docstring); `UserError` for a
    request at fault."""
    report = None
    model, train, config = req.model, req.train, req.config
    if req.run_config is not None:  # resolved once: the what-ifs change this run
        model, train, sizes, report = apply_run_config(
            req.run_config, model=model, train=train, explicit=req.explicit,
            sizes=[config.sizes],
        )  # fmt: skip
        config = replace(config, sizes=sizes[0])
    base_req = PredictRequest(model=model, train=train, graph_id=req.graph_id, configs=[config],
                              method="replay")  # fmt: skip
    base = predict(base_req, backend).predictions[0]
    if report is not None:
        base = replace(base, config=report.to_dict())
    graph = backend.entry(base.graph_id).graph
    device = get_profile(base.device)
    moment = peak_moment(graph, base.sizes, device, scenario=base.scenario, metric=base.metric)
    blocks = blocks_at(graph, moment)
    p = graph.paths[moment.path]
    mods, _ = node_modules(p)
    sources = node_sources(graph, moment.path)
    node = moment.node
    peak = {
        "path": moment.path,
        "node": node,
        "op": p.nodes["op"][node] if node >= 0 else "<before the step>",
        "module": mods[node] if node >= 0 else "",
        "source": sources[node] if sources is not None and node >= 0 else "",
        "phase": moment.phase,
        "step": moment.step,
        "metric": moment.metric,
        "allocated_bytes": moment.allocated_bytes,
        "reserved_bytes": moment.reserved_bytes,
        "requested_bytes": moment.requested_bytes,
        "rounding_bytes": moment.allocated_bytes - moment.requested_bytes,
        "cached_free_bytes": (
            None if moment.reserved_bytes is None
            else moment.reserved_bytes - moment.allocated_bytes
        ),
        "peak_allocated_bytes": moment.peak_allocated_bytes,
        "peak_reserved_bytes": moment.peak_reserved_bytes,
        "blocks": len(blocks),
    }  # fmt: skip
    names = WHATIFS if req.whatifs is None else req.whatifs
    if req.graph_id is not None:  # no model to capture again: the allocator only
        skipped = [{"name": n, "why": "a stored graph: the change needs a capture of the model"}
                   for n in names if n != "expandable_segments"]  # fmt: skip
        names = tuple(n for n in names if n == "expandable_segments")
    else:
        skipped = []

    def predict_one(r: PredictRequest) -> Answer:
        return predict(r, backend).predictions[0]

    done, more = run_whatifs(base_req, base, graph, predict_one, names=names)
    top = req.top
    return ExplainAnswer(
        prediction=base,
        peak=peak,
        by_category=group(blocks, "category"),
        by_module=group(blocks, "module", top),
        by_layer_module=group(blocks, "layers", top),
        by_source=group(blocks, "source", top),
        by_op=group(blocks, "op", top),
        largest=[b.to_dict() for b in blocks[:top]],
        whatifs=[w.to_dict() for w in done],
        not_applicable=skipped + more,
        assumptions=_assumptions(base, moment, sources is not None),
        timeline=step_timeline(graph, moment, device),
    )


def _assumptions(base: Answer, moment: Any, has_sources: bool) -> list[str]:
    out = [
        f"the peak is the first moment the simulated {base.metric} bytes reach their maximum "
        f"({'reserved' if base.metric != 'allocated' else 'allocated'} on path "
        f"{moment.path}); what is live is what the allocator holds for tensors then",
        "a backward or optimizer op is named by the module of the forward tensors or "
        "parameters it reads (autograd runs no module's forward); a tensor made before "
        "the step by the first module reading it",
        "each what-if is a replay of the changed run: `memgnn predict --method replay` with "
        "its flags gives the same bytes",
    ]
    if not has_sources:
        out.append("this graph carries no source lines (captured without them): re-capture")
    if moment.capacity_bytes is None and get_profile(base.device).is_gpu:
        out.append("the step does not fit the device: the moment is from the unlimited replay")
    return out
