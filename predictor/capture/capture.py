"""Capture one training step as a `StepGraph` with symbolic sizes.

The step runs eagerly on fake tensors (no memory, no compute) under a shape environment
in which each named input dim (B, S, ...) is a symbol; every op the step really runs is
recorded in its real order, with each new storage's byte size as an exact expression in
those symbols. One capture answers any size: evaluate the expressions. A concrete capture
(`symbolic=False`) runs the same code at fixed sizes; node for node the two agree.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from memgnn.predictor.capture.bounds import index_bound_hooks
from memgnn.predictor.capture.branches import (
    BranchState,
    CaptureError,
    DataHooks,
    alternatives,
    patched_cond,
)
from memgnn.predictor.capture.model_info import ModelInfo, describe, describe_bundle
from memgnn.predictor.capture.pipeline_step import PipelineStep
from memgnn.predictor.capture.progress import StepProgress
from memgnn.predictor.capture.replicate import replicate
from memgnn.predictor.capture.step import TrainingStep, step_plan
from memgnn.predictor.emulate.attention import check_attention, unpacked_positions
from memgnn.predictor.emulate.compile import region_aliases
from memgnn.predictor.emulate.cuda_kernels import cuda_dropout, cuda_kernel_hooks
from memgnn.predictor.emulate.flash_attn import flash_scratch, hf_flash_kernels
from memgnn.predictor.emulate.float8 import check_float8
from memgnn.predictor.emulate.kernels import (
    cpu_kernel_hooks,
    cuda_scratch,
    cuda_sdpa,
    eager_hooks,
    symbolic_hooks,
)
from memgnn.predictor.emulate.parallel import ShardedObserver, World, comm_hooks, fake_world
from memgnn.predictor.emulate.peft import blocks_unsafe
from memgnn.predictor.emulate.pipeline import rank_stages
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.blocks import (
    LayerState,
    LayerTagger,
    NotRepeated,
    PhaseReset,
    tag_registered,
)
from memgnn.predictor.ir.expr import sympy_to_source
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.pathgraph import ExprInterner, path_from_recorder
from memgnn.predictor.ir.recorder import (
    ModuleTracker,
    RecorderObserver,
    StepRecorder,
    register_state,
)
from memgnn.predictor.ir.sources import SourceFinder, store_sources
from memgnn.predictor.ir.vocab import SCENARIOS
from memgnn.predictor.spec.bundle import ModelBundle, default_blocks
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

_DATA_DEPENDENT_ERRORS: tuple[type[BaseException], ...] = ()


def _data_dependent_errors() -> tuple[type[BaseException], ...]:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (
        DataDependentOutputException,
        DynamicOutputShapeException,
        GuardOnDataDependentSymNode,
        UnsupportedOperatorException,
    )


@dataclass(kw_only=True, slots=True)
class CaptureConfig:
    symbolic: bool = True
    sizes: dict[str, int] | None = None  # trace sizes; default: the bundle's example dims
    target: str = "cuda"  # device whose defaults to follow (optimizer impl, autocast)
    scenario: str = "balanced"  # concrete captures: data-dependent sizes at min|balanced|worst
    max_paths: int | None = None  # default: the bundle's max_paths
    sm: int = 80  # CUDA target: compute capability x10, picks attention kernels
    # blocks: a model whose bundle has a depth knob (`ModelBundle.with_layers`) is captured
    # at `blocks_depth` blocks and its repeated block replicated (`predictor.capture.replicate`),
    # a full capture where that cannot be shown exact; full: always the whole model
    mode: str = "blocks"
    blocks_depth: int = 4
    # record each node's file:line in the user's code (`predictor.ir.sources`; the graph's
    # meta, not its id): what `memgnn explain` names
    sources: bool = True

    def __post_init__(self) -> None:
        if self.mode not in CAPTURE_MODES:
            raise ValueError(f"capture mode must be full or blocks, got {self.mode!r}")
        if self.blocks_depth < 4:
            raise ValueError(f"blocks_depth must be >= 4, got {self.blocks_depth}")
        if self.target not in ("cpu", "cuda"):
            raise ValueError(f"target must be cpu or cuda, got {self.target!r}")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be min, balanced or worst, got {self.scenario!r}")
        if self.max_paths is not None and self.max_paths < 1:
            raise ValueError("max_paths must be >= 1")


CAPTURE_MODES = ("full", "blocks")


class _Run:
    """One capture run (one path) inside its own fake mode and shape environment."""

    def __init__(
        self, bundle: ModelBundle, train: TrainSpec, cfg: CaptureConfig, sizes, tag_layers=False,
        make_step: Callable[[str], Any] | None = None, rank: int = 0,
    ):  # fmt: skip
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.bundle, self.train, self.cfg, self.sizes = bundle, train, cfg, sizes
        self.env = ShapeEnv(duck_shape=False) if cfg.symbolic else None
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.info: ModelInfo | None = None
        self.layer_state = LayerState() if tag_layers else None
        self.block_prefix = ""
        # the runner to capture (its face is TrainingStep's); None: TrainingStep itself
        self.make_step = make_step
        self.rank = rank  # the rank of a --gpus N job to capture (--pp: the stage)

    def _symbolic_sizes(self) -> tuple[dict[str, Any], dict[Any, str]]:
        if self.env is None:
            return dict(self.sizes), {}
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        out, names = {}, {}
        for name, hint in self.sizes.items():
            if name in self.bundle.static_dims:
                out[name] = hint
                continue
            sym = self.env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
            out[name] = self.env.create_symintnode(sym, hint=hint)
            names[sym] = name
        return out, names

    def run(self, prefix: list[bool]) -> tuple[StepRecorder, BranchState, dict[Any, str], Any]:
        if not self.train.parallel.distributed:
            return self._run(prefix, None)
        # rank 0 of --gpus (predictor/emulate/parallel.py); --pp: the stage captured
        with fake_world(self.train, self.rank) as world:
            return self._run(prefix, world)

    def _run(self, prefix: list[bool], world: World | None):
        state = BranchState(prefix=prefix)
        warmup, recorded = step_plan(self.train)
        sharded = world is not None
        # how far this path's steps have got, for the running Progress's estimate
        self._progress = StepProgress(
            None, steps=len(warmup or ()) + len(recorded),
            micro=min(self.train.loop.grad_accum, 2),
        )  # fmt: skip
        with self.mode:
            if self.make_step is not None:
                step = self.make_step(self.cfg.target)
            elif self.train.parallel.pp > 1:  # the rank's pipeline stage (emulate.pipeline)
                step = PipelineStep(
                    self.bundle, self.train, device=torch.device("cpu"),
                    target=self.cfg.target, fake=True, world=world,
                )  # fmt: skip
            else:
                step = TrainingStep(
                    self.bundle,
                    self.train,
                    device=torch.device("cpu"),
                    target=self.cfg.target,
                    fake=True,
                    world=world,
                )
            self.info = describe(step.model, self.bundle, self.train)
            sizes, names = self._symbolic_sizes()
            modules = {name or "<root>": m for name, m in step.model.named_modules()}
            hooks = DataHooks(state, modules, shape_env=self.env, scenario=self.cfg.scenario)
            table = hooks.table() | eager_hooks() | symbolic_hooks() | index_bound_hooks()
            if self.cfg.target == "cpu":
                table |= cpu_kernel_hooks()
            else:  # CUDA kernels where they allocate otherwise (predictor.emulate.cuda_kernels)
                table |= cuda_kernel_hooks()
            if sharded:
                table |= comm_hooks(gloo=self.cfg.target == "cpu")
            if hasattr(step, "dispatch_hooks"):  # a runner's own (UserStep's value reads)
                table = step.dispatch_hooks(table)
            blocks = self._blocks(step.model)
            tagger: Any = contextlib.nullcontext()
            if self.layer_state is not None:
                tagger = LayerTagger(self.layer_state, blocks)
            with (
                ModuleTracker(step.model) as tracker,
                patched_cond(state),
                self._kernels(),
                tagger,
            ):
                if warmup:  # run, unrecorded; what it leaves alive is registered below
                    warm = StepRecorder(
                        hooks=table, module_stack=tracker.stack, track_resize=sharded
                    )
                    with warm:
                        self._run_steps(step, sizes, warm, state, warmup)
                    warm.close()
                rec = StepRecorder(
                    hooks=table,
                    module_stack=tracker.stack,
                    scratch=self._scratch(),
                    track_resize=sharded,
                    layers=self.layer_state,
                    sources=SourceFinder() if self.cfg.sources else None,
                )
                register_state(rec, step.state_tensors())
                if self.layer_state is not None:
                    tag_registered(rec, blocks, step.optimizer)
                with rec:
                    self._run_steps(step, sizes, rec, state, recorded)
                rec.exclude(step.host_state())
                rec.close()
        names.update({d["symbol"]: n for n, d in state.data.items() if "symbol" in d})
        return rec, state, names, self.env

    def _blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The repeated blocks, named `<prefix>0`, `<prefix>1`, ... (tagged captures)."""
        if self.layer_state is None:
            return []
        blocks = (self.bundle.blocks or default_blocks)(model)
        names = {id(m): name for name, m in model.named_modules()}
        found = [names.get(id(b), "") for b in blocks]
        prefix = found[0][:-1] if found and found[0].endswith("0") else ""
        if not prefix or found != [f"{prefix}{i}" for i in range(len(found))]:
            raise NotRepeated(f"the blocks are not named <prefix><index>: {found[:3]}")
        self.block_prefix = prefix
        return blocks

    def _kernels(self):
        stack = contextlib.ExitStack()
        stack.enter_context(unpacked_positions())
        if self.cfg.target != "cuda":
            return stack
        stack.enter_context(cuda_sdpa(self.cfg.sm))
        stack.enter_context(cuda_dropout())
        if self.train.kernels.attention == "flash":
            stack.enter_context(hf_flash_kernels())
        return stack

    def _scratch(self):
        if self.cfg.target != "cuda":
            return None
        sm = self.cfg.sm

        def scratch(func, args):
            got = cuda_scratch(func, args, sm)  # a formula may be 0 at the trace sizes:
            if isinstance(got, torch.SymInt) or got:  # no truth test on a SymInt (a guard)
                return got
            return flash_scratch(func, args)

        return scratch

    def _run_steps(self, step, sizes, rec: StepRecorder, state: BranchState, steps) -> None:
        if step.world is not None:
            observer = ShardedObserver(rec, step.model, on_forward=state.reset_counters)
        else:
            observer = RecorderObserver(rec, on_forward=state.reset_counters)
        if rec.layers is not None:
            observer = PhaseReset(observer, rec.layers)
        self._progress.inner, observer = observer, self._progress
        try:
            step.run(sizes, observer, steps=steps)
        except CaptureError:
            raise
        except _data_dependent_errors() as exc:
            last = rec.nodes[-1].op if rec.nodes else "<none>"
            module = rec.module_stack[-1] if rec.module_stack else "<root>"
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
            raise CaptureError(
                f"cannot capture {self.bundle.name!r}: data-dependent operation in module "
                f"{module!r} after op {last!r}: {first_line}"
            ) from exc


def capture(
    bundle: ModelBundle,
    train: TrainSpec,
    config: CaptureConfig | None = None,
    *,
    make_step: Callable[[str], Any] | None = None,
) -> StepGraph:
    """Capture every control-flow path of one training step of `bundle` under `train`.

    `make_step(target)` builds another runner with `TrainingStep`'s face (model,
    optimizer, state_tensors, host_state, run; e.g. `capture.user_step.UserStep`, the
    user's own step function) inside the capture's fake mode; it is captured in full."""
    cfg = config or CaptureConfig()
    check_attention(train, cfg.target, cfg.sm)
    check_float8(train, cfg.target, cfg.sm)
    sizes = bundle.sizes(cfg.sizes)
    why = "asked for (mode full)"
    if make_step is not None:
        why = "the user's own step function"
    elif cfg.mode == "blocks":
        graph, why = _capture_blocks(bundle, train, cfg, sizes)
        if graph is not None:
            return graph
    if train.parallel.pp > 1 and make_step is None:
        return _capture_stages(bundle, train, cfg, sizes)
    max_paths = cfg.max_paths or bundle.max_paths
    t0 = time.perf_counter()
    todo: list[list[bool]] = [[]]
    runs = []
    info: ModelInfo | None = None
    while todo:
        prefix = todo.pop()
        runner = _Run(bundle, train, cfg, sizes, make_step=make_step)
        run = runner.run(prefix)
        info = info or runner.info
        runs.append(run)
        state = run[1]
        todo.extend(reversed(alternatives(state)))
        if len(runs) + len(todo) > max_paths:
            where = state.conditions[-1]["module"] if state.conditions else "<root>"
            raise CaptureError(
                f"{bundle.name!r} has more than {max_paths} control-flow paths (branch points "
                f"in module {where!r} and others); raise max_paths or make the branch static"
            )
    graph = _assemble(bundle, train, cfg, sizes, runs)
    _stamp(graph, cfg, t0, info, {"mode": "full", "why": why})
    log.info(
        "captured %s: %d path(s), %d nodes in %.1fs",
        bundle.name,
        len(graph.paths),
        sum(p.num_nodes for p in graph.paths),
        graph.meta["capture_seconds"],
    )
    return graph


def _capture_stages(
    bundle: ModelBundle, train: TrainSpec, cfg: CaptureConfig, sizes: dict[str, int]
) -> StepGraph:
    """`--pp N`: each stage's rank captured on its own (`emulate.pipeline`), one path per
    stage (condition `pipeline_stage`): the answer is the worst stage, each one listed."""
    t0 = time.perf_counter()
    runs = []
    for stage in range(train.parallel.pp):
        # the stage's first rank (torchtitan's (pp, dp_shard, tp) mesh: ranks from
        # stage x dp x tp): under --sharding fsdp it holds the largest (padded) shards
        rank = stage * train.parallel.dp * train.parallel.tp
        runner = _Run(bundle, train, cfg, sizes, rank=rank)
        rec, state, names, env = runner.run([])
        if alternatives(state) or state.data:
            raise CaptureError(
                f"--pp {train.parallel.pp}: {bundle.name!r} has data-dependent branches or "
                "sizes, which memgnn does not model under pipeline parallelism"
            )
        held = rank_stages(train.parallel.pp, train.parallel.pp_stages_per_rank, stage)
        state.conditions.append(
            {"kind": "pipeline_stage", "stage": stage, "rank": rank, "stages": held}
        )
        runs.append((rec, state, names, env))
    graph = _assemble(bundle, train, cfg, sizes, runs)
    info = describe_bundle(bundle, train, cfg.target)  # the whole model, not one stage
    _stamp(graph, cfg, t0, info, {"mode": "full", "why": f"--pp {train.parallel.pp}: per stage"})
    log.info("captured %s: %d pipeline stages in %.1fs", bundle.name, train.parallel.pp,
             graph.meta["capture_seconds"])  # fmt: skip
    return graph


def _stamp(
    graph: StepGraph, cfg: CaptureConfig, t0: float, info: ModelInfo | None, how: dict
) -> None:
    """The meta every capture records: time since `t0`, torch, target, the model and `how`
    it was captured (full, or blocks replicated)."""
    store_sources(graph)
    graph.meta.update(
        capture_seconds=round(time.perf_counter() - t0, 3),
        torch_version=torch.__version__,
        target=cfg.target,
        symbolic=cfg.symbolic,
        scenario=None if cfg.symbolic else cfg.scenario,
        model_info=info.to_dict() if info is not None else None,
        capture=how,
    )


def _assemble(bundle: ModelBundle, train: TrainSpec, cfg: CaptureConfig, sizes, runs) -> StepGraph:
    interner = ExprInterner()
    paths, guards, data_symbols = [], [], {}
    for rec, state, names, env in runs:
        conditions = [dict(c) for c in state.conditions]
        paths.append(path_from_recorder(rec, conditions, interner, names, env))
        input_names = {k: v for k, v in names.items() if v in sizes}
        for name, d in state.data.items():
            if name not in data_symbols:
                data_symbols[name] = {
                    key: interner.source(d[key], input_names, env)
                    for key in ("lo", "balanced", "hi")
                } | {"op": d["op"], "module": d["module"]}
        if cfg.symbolic:
            for name in bundle.static_dims:  # fixed at capture: valid at this size only
                src = f"({name} == {sizes[name]})"
                if src not in guards:
                    guards.append(src)
        if env is not None:
            aliases = region_aliases(env)
            for g in env.guards:
                src = sympy_to_source(env.replace(g.expr).xreplace(aliases), names)
                if src not in guards:
                    guards.append(src)
            for src in _specialized(env, names, sizes):
                if src not in guards:
                    guards.append(src)
    return StepGraph(
        model={"name": bundle.name, "family": bundle.family, "hparams": bundle.hparams},
        train=train.flat(),
        symbols=dict(sizes),
        data_symbols=data_symbols,
        guards=guards,
        exprs=interner.sources,
        paths=paths,
    )


def _specialized(env: Any, names: dict[Any, str], sizes: dict[str, int]) -> list[str]:
    """Guards for the input sizes the trace fixed or tied to others. The shape environment
    turns a guard such as `Eq(B, 3)` into a replacement (B -> 3) and drops it from its
    guards, so every expression reads 3 where B was (Bamba's mamba mixer fixes the batch
    this way): without a guard of its own the graph would answer any batch as B = 3."""
    import sympy

    out = []
    for sym, value in env.replacements.items():
        name = names.get(sym)
        if name not in sizes or value == sym:
            continue
        try:
            out.append(sympy_to_source(sympy.Eq(sym, value, evaluate=False), names))
        except UserError:  # tied to a symbol the graph does not name: fixed at the trace
            out.append(f"({name} == {sizes[name]})")
    return out


def blocks_ineligible(bundle: ModelBundle, train: TrainSpec, cfg: CaptureConfig) -> str | None:
    """Why `bundle` cannot be captured by replicating its blocks (None: it can be tried)."""
    if bundle.layers is None or bundle.with_layers is None:
        return "the model has no depth knob (ModelBundle.with_layers)"
    if bundle.layers <= cfg.blocks_depth:
        return f"{bundle.layers} blocks: no more than the {cfg.blocks_depth} a replication captures"
    if train.parallel.distributed:
        return f"--gpus {train.parallel.gpus} (one rank of a process group) is captured in full"
    if train.offload.activations == "torchtune":  # its forward stash spans blocks
        return "torchtune's offloading keeps each tensor until 5 more are saved, across blocks"
    ck = len(train.activations.checkpointed(bundle.layers))
    if 0 < ck < bundle.layers:
        return f"checkpointing {ck} of {bundle.layers} blocks: the blocks differ"
    return blocks_unsafe(train)


def _capture_blocks(
    bundle: ModelBundle, train: TrainSpec, cfg: CaptureConfig, sizes: dict[str, int]
) -> tuple[StepGraph | None, str]:
    """Capture at `cfg.blocks_depth` blocks and replicate the middle block (see
    `predictor.capture.replicate`); (None, why) where that is not shown to be exact."""
    why = blocks_ineligible(bundle, train, cfg)
    if why is not None:
        log.info("%s: full capture: %s", bundle.name, why)
        return None, why
    t0 = time.perf_counter()
    depth, layers = cfg.blocks_depth, bundle.layers
    assert bundle.with_layers is not None and layers is not None
    small = bundle.with_layers(depth)
    runner = _Run(small, train, cfg, sizes, tag_layers=True)
    try:
        run = runner.run([])
        rec, state = run[0], run[1]
        if alternatives(state) or state.data:
            raise NotRepeated("the step has data-dependent branches or sizes")
        assert runner.layer_state is not None
        if runner.layer_state.problems:
            raise NotRepeated(runner.layer_state.problems[0])
        graph = _assemble(bundle, train, cfg, sizes, [run])
        path, table = replicate(
            graph.paths[0],
            [n.layer for n in rec.nodes],
            [s.layer for s in rec.storages],
            graph.exprs,
            depth=depth,
            layers=layers,
            prefix=runner.block_prefix,
        )
    except (NotRepeated, CaptureError) as exc:
        why = f"the {depth}-block capture does not replicate: {exc}"
        log.warning("%s: full capture: %s", bundle.name, why)
        return None, why
    graph.paths, graph.exprs, graph._table = [path], table, None
    info = describe_bundle(bundle, train, cfg.target)
    _stamp(graph, cfg, t0, info, {"mode": "blocks", "captured_blocks": depth, "blocks": layers})
    log.info(
        "captured %s: %d blocks replicated from a %d-block capture, %d nodes in %.1fs",
        bundle.name, layers, depth, path.num_nodes, graph.meta["capture_seconds"],
    )  # fmt: skip
    return graph, ""
