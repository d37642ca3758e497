"""torchao's float8 training (`--float8 tensorwise|rowwise|rowwise_with_gw_hp`), run by torchao.

`convert_to_float8_training(model, module_filter_fn=..., config=Float8LinearConfig.
from_recipe_name(recipe))` swaps the model's `nn.Linear` layers for torchao's `Float8Linear`
before anything else wraps them (torchtitan converts the model before parallelising and
compiling it). Capture then runs torchao's own forward and backward
(`matmul_with_hp_or_float8_args`, `hp_tensor_to_float8_dynamic`, the `Float8TrainingTensor`
dispatch to `torch._scaled_mm`) on fake tensors: torch 2.13 has a meta function for
`_scaled_mm` (its output's shape and dtype) and CPU kernels for the float8 casts, so every
storage the step allocates is the library's, none is stood in for. On a real CPU the same
code runs too (`tests/predictor/emulate/test_float8.py` compares both).

What torchao 0.18 keeps and makes, per converted `N x K` Linear over `M` tokens:
- kept for backward: the input and the weight in high precision (`ctx.save_for_backward(
  input_hp, weight_hp_t)`): eager float8 training keeps no float8 copy; backward casts the
  input, weight and gradient again (rowwise: along the other axis; rowwise_with_gw_hp: the
  grad-weight gemm in high precision);
- temporaries: each cast's amax reduction, fp32 scale (a 0-dim tensor for tensorwise, one
  per row or column for rowwise), the scaled fp32 copy and the float8 `M x K` / `N x K`
  data (and the column-major copies `_scaled_mm` wants), the gemm output in the input's dtype;
- the weight, its gradient and the optimizer state stay in the training dtype.
Under autocast (`--precision amp-bf16`, CUDA targets only) `Float8Linear.forward` casts its
input to bf16 itself and saves the fp32 weight as it is, where nn.Linear under autocast saves
a bf16 copy of every weight: float8 keeps N x K x 2 bytes less per converted layer (for
Llama-3.1-8B, 13,958,643,712 B: benchmarks/results/float8.md).

Which layers (torchtitan's `module_filter_fn`): `nn.Linear` layers whose two dims are
divisible by 16 (the float8 tensor cores' requirement), less those whose name contains an
entry of `--float8-filter-fqns`. Its default `output` is torchtitan's configs' filter_fqns
(its output projection), here the model's output head by identity (transformers'
`get_output_embeddings()`, else a child named `output` or `lm_head`), so BERT's
`attention.output.dense` is not caught by the word.

`--float8-fsdp-all-gather` (tensorwise, under FSDP2): torchao's
`enable_fsdp_float8_all_gather`, the weight a `WeightWithDynamicFloat8CastTensor` whose FSDP
hooks cast each shard to float8 before the all-gather (the unsharded weight one byte an
element); `--float8-precompute-scale`: torchtitan's `precompute_float8_dynamic_scale_for_
fsdp` after the optimizer step (`precompute_scales`). Both run as the libraries run them.

Assumed (the answer's model says `+ float8 <recipe>` and whether FSDP gathers in float8):
no torchtitan `auto_filter_small_kn`. On CUDA torchtitan needs compute capability >= 8.9.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "OUTPUT_HEAD",
    "apply_float8",
    "check_float8",
    "float8_filter",
    "float8_label",
    "float8_layers",
    "output_head",
    "precompute_scales",
]

OUTPUT_HEAD = "output"  # the --float8-filter-fqns entry that names the output head
MIN_SM = 89  # torchtitan: float8 needs SM89 (Ada) or newer


def check_float8(train: TrainSpec, target: str, sm: int | None = None) -> None:
    """ValueError naming --float8 when the target cannot run float8 gemms."""
    recipe = train.numerics.float8
    if recipe == "none":
        return
    if target != "cuda" and train.numerics.autocast_dtype is not None:
        raise ValueError(
            f"--float8 {recipe} with --precision {train.numerics.precision} on a CPU target: "
            "Float8Linear follows CUDA autocast only (its CPU run mixes dtypes and fails); "
            "use --precision bf16 or fp32, or a GPU --device"
        )
    if target != "cuda" or sm is None:
        return
    if sm < MIN_SM:
        raise ValueError(
            f"--float8 {recipe} needs compute capability 8.9 or newer (float8 tensor cores; "
            f"torchtitan refuses older GPUs); the target has sm_{sm}: drop --float8"
        )


def output_head(model: nn.Module) -> nn.Module | None:
    """The model's output projection: transformers' output embeddings, else a direct child
    named `output` (torchtitan, torchtune) or `lm_head`."""
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except (AttributeError, NotImplementedError):
            head = None
        if isinstance(head, nn.Module):
            return head
    for name in ("output", "lm_head"):
        child = getattr(model, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


def float8_filter(model: nn.Module, filters: tuple[str, ...]) -> Callable[[nn.Module, str], bool]:
    """torchtitan's `module_filter_fn` over `model`: an exact `nn.Linear` (convert_to_float8_
    training swaps subclasses too; a Linear subclass is some library's own layer) whose
    dims are multiples of 16 and whose name contains no filter; `output` is the head."""
    head = output_head(model) if OUTPUT_HEAD in filters else None
    words = tuple(f for f in filters if f != OUTPUT_HEAD)

    def keep(module: nn.Module, fqn: str) -> bool:
        if type(module) is not nn.Linear or module is head:
            return False
        n, k = module.weight.shape
        return n % 16 == 0 and k % 16 == 0 and not any(w in fqn for w in words)

    return keep


def float8_layers(model: nn.Module) -> tuple[int, int]:
    """(Float8Linear layers, all Linear layers) of a model."""
    from torchao.float8.float8_linear import Float8Linear

    modules = list(model.modules())
    return (
        sum(isinstance(m, Float8Linear) for m in modules),
        sum(isinstance(m, nn.Linear) for m in modules),
    )


def float8_label(model: nn.Module, train: TrainSpec) -> str:
    """` + float8 rowwise (12/13 Linear)` for the answer's model class (`, FSDP float8
    all-gather`, `, precomputed scales` inside the brackets when on); '' without --float8."""
    if train.numerics.float8 == "none":
        return ""
    converted, linears = float8_layers(model)
    extra = "".join(
        text
        for on, text in (
            (train.numerics.float8_fsdp_all_gather, ", FSDP float8 all-gather"),
            (train.numerics.float8_precompute_scale, ", precomputed scales"),
        )
        if on
    )
    return f" + float8 {train.numerics.float8} ({converted}/{linears} Linear{extra})"


def _autocast_input(device_type: str) -> Callable:
    """`Float8Linear.forward` casts its input to the CUDA autocast dtype when CUDA autocast
    is on (`torch.is_autocast_enabled()`); capture autocasts on its own device type, so
    for a CUDA target the same cast is made from that device's autocast state."""

    def hook(module: nn.Module, args: tuple) -> tuple | None:
        if not torch.is_autocast_enabled(device_type) or not args:
            return None
        dtype = torch.get_autocast_dtype(device_type)
        return (args[0].to(dtype), *args[1:])

    return hook


def apply_float8(model: nn.Module, train: TrainSpec, *, device: torch.device, target: str) -> int:
    """Convert `model` in place for `train.numerics.float8`; return the layers converted."""
    recipe = train.numerics.float8
    if recipe == "none":
        return 0
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = Float8LinearConfig.from_recipe_name(recipe)
    if train.numerics.float8_fsdp_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    keep = float8_filter(model, train.numerics.float8_filters)
    convert_to_float8_training(model, module_filter_fn=keep, config=config)
    converted = [m for m in model.modules() if isinstance(m, Float8Linear)]
    if not converted:
        raise ValueError(
            f"--float8 {recipe}: no Linear layer of this model qualifies (dims divisible by "
            f"16, not filtered by --float8-filter-fqns {train.numerics.float8_filter_fqns!r})"
        )
    if target == "cuda" and device.type != "cuda":
        for m in converted:
            m.register_forward_pre_hook(_autocast_input(device.type))
    log.info("float8 %s: %d Linear layers converted", recipe, len(converted))
    return len(converted)


def precompute_scales(model: nn.Module, train: TrainSpec) -> None:
    """torchtitan's post-optimizer hook under `--float8-precompute-scale`: torchao's
    `precompute_float8_dynamic_scale_for_fsdp` (every weight's amax by `_foreach_norm`, one
    all-reduce of them stacked, a scale kept on each weight's local tensor for the next
    all-gather's cast)."""
    if not train.numerics.float8_precompute_scale:
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
