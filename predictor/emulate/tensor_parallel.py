"""Tensor parallelism: one rank of `--tp N`, run by PyTorch's DTensor `parallelize_module`.

`--tp N` splits each repeated block's linear layers over N ranks the way torchtitan and
transformers' `tp_plan` do, with PyTorch's own `ColwiseParallel` / `RowwiseParallel`
applied by `torch.distributed.tensor.parallel.parallelize_module` over the fake process
group of `predictor.emulate.parallel` (rank 0's coordinates). What the rank holds is what
DTensor allocates, recorded node for node:

- colwise linears (q/k/v, gate/up): the weight's rows `Shard(0)`, the input replicated (its
  gradient all-reduced in backward), the output a local tensor with 1/N of the features
  (1/N of the heads: transformers' attention reshapes with `view(..., -1, head_dim)`);
- rowwise linears (o, down): the weight's columns `Shard(1)`, the input the local
  features, the output a partial sum all-reduced to a replicated tensor (functional
  `all_reduce`: a new buffer the size of the block's output);
- everything else (embeddings, norms, lm_head, rotary buffers) stays whole on every rank:
  replicated parameters, gradients and optimizer state. Each rank computes the full logits
  and loss (no loss parallelism, no sequence parallelism: the norms and the residual
  stream hold the whole sequence on every rank).

The plan: the model config's `base_model_tp_plan` where transformers ships one (Llama,
Mistral, Qwen2/3, Gemma, ...: `layers.*.self_attn.q_proj: colwise`, ...), its keys under
the base model's prefix; its `colwise`/`rowwise` entries map to `ColwiseParallel()` /
`RowwiseParallel()`, any other style (MoE experts, packed or local layouts) is refused by
name. A model without one gets torchtitan's Llama plan by module name (`wq/wk/wv/w1/w3`,
`q_proj/k_proj/v_proj/gate_proj/up_proj` colwise; `wo/w2`, `o_proj/down_proj` rowwise)
inside the repeated blocks. The heads (`num_attention_heads`, `num_key_value_heads`) and
every split dimension must divide by N (a UserError names the one that does not).

With `--sharding fsdp` the world is a 2-D mesh (dp x tp, `--gpus = dp x --tp`): TP over
the `tp` dimension first, then FSDP2's `fully_shard` per block and on the root over `dp`,
as torchtitan's `parallelize_llama` does; rank 0 holds dim-0 FSDP shards of its TP shards.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.recorder import unrecorded
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "TPPlan",
    "apply_tp",
    "real_mesh_concatenation",
    "tp_note",
    "tp_plan",
    "unguarded_propagation",
    "unrecorded_propagation",
]

# torchtitan's Llama plan (torchtitan/models/llama3/infra/parallelize.py: attention.wq/wk/wv
# and feed_forward.w1/w3 colwise, attention.wo and feed_forward.w2 rowwise), with the
# transformers names of the same layers
COLWISE_NAMES = ("wq", "wk", "wv", "w1", "w3", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE_NAMES = ("wo", "w2", "o_proj", "down_proj")
STYLES = ("colwise", "rowwise")


@dataclass(kw_only=True, slots=True)
class TPPlan:
    """Which linears split how (`styles`: module name -> colwise|rowwise), and from where."""

    styles: dict[str, str]
    source: str  # "config.base_model_tp_plan" | "torchtitan llama plan (by module name)"

    def __post_init__(self) -> None:
        bad = {n: s for n, s in self.styles.items() if s not in STYLES}
        if bad:
            raise ValueError(f"TP styles must be one of {STYLES}, got {bad}")


def _config_plan(model: nn.Module) -> dict[str, str] | None:
    """transformers' `config.base_model_tp_plan`, keys under the base model's prefix."""
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None
    prefix = getattr(model, "base_model_prefix", "")
    under = f"{prefix}." if prefix and isinstance(getattr(model, prefix, None), nn.Module) else ""
    return {f"{under}{k}": v for k, v in plan.items()}


def _resolve(model: nn.Module, patterns: dict[str, str], tp: int) -> dict[str, str]:
    """Each pattern's modules by name (the `*` of parallelize_module's plan keys): every
    one must be an `nn.Linear` whose split dimension divides by `tp`."""
    styles: dict[str, str] = {}
    for pattern, style in patterns.items():
        if style not in STYLES:
            raise UserError(
                f"--tp {tp}: the model's tp plan splits {pattern!r} as {style!r}, which memgnn "
                f"does not model (it runs {', '.join(STYLES)}: ColwiseParallel, "
                "RowwiseParallel)"
            )
        atoms = pattern.split(".")
        for name, module in model.named_modules():
            parts = name.split(".")
            if len(parts) != len(atoms):
                continue
            if not all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True)):
                continue
            if type(module) is not nn.Linear:
                raise UserError(
                    f"--tp {tp}: {name} ({type(module).__name__}) is not a plain nn.Linear; "
                    "memgnn splits nn.Linear layers only (no adapters or quantised layers)"
                )
            dim = module.out_features if style == "colwise" else module.in_features
            if dim % tp:
                raise UserError(
                    f"--tp {tp}: {name} splits {dim} {'output' if style == 'colwise' else 'input'}"
                    f" features, not divisible by {tp}"
                )
            styles[name] = style
    return styles


def _check_heads(model: nn.Module, tp: int) -> None:
    config = getattr(model, "config", None)
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, key, None)
        if isinstance(heads, int) and heads % tp:
            raise UserError(
                f"--tp {tp}: {key} = {heads} is not divisible by {tp} (each rank takes whole heads)"
            )


def tp_plan(model: nn.Module, blocks: list[nn.Module], tp: int) -> TPPlan:
    """The plan `--tp` applies to `model` (module docstring); a UserError where none fits."""
    _check_heads(model, tp)
    patterns = _config_plan(model)
    if patterns is not None:
        styles = _resolve(model, patterns, tp)
        source = "config.base_model_tp_plan"
    else:
        inside = {id(m) for b in blocks for m in b.modules()}
        styles = {}
        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if id(module) in inside and type(module) is nn.Linear:
                if leaf in COLWISE_NAMES:
                    styles[name] = "colwise"
                elif leaf in ROWWISE_NAMES:
                    styles[name] = "rowwise"
        styles = _resolve(model, styles, tp)
        source = "torchtitan llama plan (by module name)"
    if not styles:
        raise UserError(
            f"--tp {tp}: no tensor-parallel plan for {type(model).__name__}: its config has no "
            "base_model_tp_plan and its blocks have no Llama-named linears "
            f"({', '.join(COLWISE_NAMES + ROWWISE_NAMES)})"
        )
    return TPPlan(styles=styles, source=source)


def apply_tp(model: nn.Module, blocks: list[nn.Module], tp_mesh: Any, tp: int) -> TPPlan:
    """`parallelize_module(model, tp_mesh, plan)` with `tp_plan`'s styles; returns the plan."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = tp_plan(model, blocks, tp)
    make = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model, tp_mesh, {name: make[s]() for name, s in plan.styles.items()})
    log.info("--tp %d: %d linears split (%s)", tp, len(plan.styles), plan.source)
    return plan


@contextlib.contextmanager
def unguarded_propagation() -> Iterator[None]:
    """DTensor's sharding propagation without shape guards. Choosing an op's strategy,
    DTensor asks of every view whether each split dimension could stay sharded
    (`guard_or_false(size % mesh_size == 0)`, `_view_ops._analyze_split`), on tensors that
    are not sharded there too (the replicated activations around a linear's
    `view(B * S, H)`); at symbolic sizes that would pin the capture to `B % N == 0`. The
    strategy DTensor picks for an unsharded dimension does not depend on the answer
    (tests/predictor/emulate/test_tensor_parallel.py captures at an odd B concretely and
    compares node for node), so the propagation runs with the shape env's guards
    suppressed."""
    from torch._guards import detect_fake_mode
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._sharding_prop import LocalLRUCache, ShardingPropagator

    inner = ShardingPropagator.propagate_op_sharding_non_cached
    prop = DTensor._op_dispatcher.sharding_propagator
    cached = prop.propagate_op_sharding

    def propagate(self: Any, op_schema: Any) -> Any:
        mode = detect_fake_mode()
        env = getattr(mode, "shape_env", None)
        with env.suppress_guards() if env is not None else contextlib.nullcontext():
            return inner(self, op_schema)

    ShardingPropagator.propagate_op_sharding_non_cached = propagate  # type: ignore[method-assign]
    prop.propagate_op_sharding = LocalLRUCache(prop.propagate_op_sharding_non_cached)
    try:
        yield
    finally:
        ShardingPropagator.propagate_op_sharding_non_cached = inner  # type: ignore[method-assign]
        prop.propagate_op_sharding = cached


@contextlib.contextmanager
def real_mesh_concatenation() -> Iterator[None]:
    """FSDP2 over a TP-split model joins the dp and tp meshes (`DeviceMesh._concatenate`,
    `FSDPParam._init_sharding_spec_tp`) when `fully_shard` runs, inside the capture's fake
    mode; the mesh is a real tensor of rank ids that the join searches (`nonzero`): it runs
    on real tensors, as in a real job."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    concatenate = DeviceMesh._concatenate

    def real(device_mesh_list: list[Any]) -> Any:
        with unset_fake_temporarily():
            return concatenate(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(real)  # type: ignore[method-assign]
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(concatenate)  # type: ignore[method-assign]


@contextlib.contextmanager
def unrecorded_propagation() -> Iterator[None]:
    """DTensor's shape propagation unrecorded: it runs each op on fake tensors of the global
    shape to learn the output's, which allocates nothing on a real job (a real job's
    recorder sees the same fake tensors: this is for real runs recorded too)."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    propagator = ShardingPropagator._propagate_tensor_meta_non_cached

    def shape_only(self: Any, op_schema: Any) -> Any:
        with unrecorded():
            return propagator(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = shape_only  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = propagator  # type: ignore[method-assign]


def tp_note(spec: Any) -> dict[str, Any]:
    """What `--tp` ran (`emulate.tensor_parallel`): what is split, what stays whole."""
    return {
        "tp": spec.parallel.tp,
        "dp": spec.parallel.dp,
        "tp_split": "each block's linears (the config's base_model_tp_plan, else "
        "torchtitan's Llama plan): ColwiseParallel / RowwiseParallel",
        "tp_replicated": "embeddings, norms, lm_head, logits and loss (no sequence or loss "
        "parallelism)",
    }
