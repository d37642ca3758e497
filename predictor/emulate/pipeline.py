"""Pipeline parallelism: one stage of `--pp N`, run by PyTorch's `torch.distributed.pipelining`.

`--pp N` splits the model's repeated blocks evenly into N stages, one per rank, as
torchtitan's `pipeline_llm` does with `pipeline_parallel_layers_per_stage = L / N`: stage k
holds blocks [k L/N, (k+1) L/N) under their own names (`layers.<i>`), the first stage also
the token embeddings, the last the final norm and `lm_head`, every stage the rotary
embedding (torchtitan keeps `freqs_cis` on each). The stage module's forward is the
decoder's own (`LlamaModel.forward`: position ids, `create_causal_mask`, rotary, the
layers), from the embeddings or from the received hidden states. The rank wraps it in
PyTorch's `PipelineStage` (no example inputs: the shapes are inferred on the first step,
as torchtitan builds its stages) and runs `ScheduleGPipe` or `Schedule1F1B` with
torchtitan's loss (`cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`) over
`--microbatches` micro-batches of `--batch` samples each, `step(..., return_outputs=False)`
as torchtitan's train loop calls it; then the optimizer and `zero_grad`. What the rank holds
is what PyTorch allocates, recorded node for node: the stage's parameters, gradients and
optimizer state, the receive buffers the stage keeps per micro-batch (activations from the
previous stage, gradients from the next), the activations of every micro-batch in flight
(GPipe: all of them before the first backward; 1F1B: up to N - k on stage k, so the first
stage holds the most), and the first step's shape inference (one micro-batch's forward and
input-gradient backward, freed before the schedule runs).

`--pp-schedule interleaved1f1b` splits the blocks into 2N stages and gives rank r stages r
and r + N (torchtitan's default for a multi-stage schedule, its "loop" style): the rank's
model parts (`StageParts`), one `PipelineStage` each, run by `ScheduleInterleaved1F1B`; one
optimizer over both parts (torchtitan keeps one per part: the same state, the same
for-loop steps; a foreach or fused step groups the tensors per part there).

Composed with FSDP2 and TP (`--sharding fsdp`, `--tp`: `emulate.parallel.parallelize`),
each model part is split and sharded before its `PipelineStage` is built, as torchtitan
builds them; PyTorch's `PipelineStage` then runs every micro-batch's backward without
gradient sync or reshard (`backward_maybe_with_nosync`) and reduce-scatters once after the
last (`perform_reduce_grad`): what the rank holds meanwhile (the unsharded gradients and
parameters of its stage) is recorded with the rest.

Under the fake process group (one rank in one process, `emulate.parallel.fake_world`) the
tensor sends and receives run as c10d ops that move no data, into the buffers the stage
allocated (the same as in a real job). Two exchanges carry values the rank needs, and the
other ranks are not there to send them; `peer_metadata` answers them as the peers would:
- the warm-up vote on static versus inferred shapes (`_warmup_p2p`: int32 scalars, read
  with `.item()`): every stage is built without example inputs, so every rank votes
  "infer" and the vote comes out DYNAMIC; the shim sets that without the 4-byte tensors;
- the shape metadata the previous stage sends forward and the next sends back
  (`send_object_list` / `recv_object_list`, pickled): the hidden states between stages,
  (micro-batch, S, hidden) in the embedding's dtype, requiring grad, and their gradient.
In a real job those exchanges allocate a few hundred bytes (pickles, sizes, votes) and free
them at once, before any activation: not in the answer, never at its peak.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "DecoderStage",
    "StageParts",
    "peer_metadata",
    "rank_stages",
    "pipeline_loss",
    "pp_note",
    "stage_bundle",
    "stage_layers",
    "stage_schedule",
]

SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved1f1b": "ScheduleInterleaved1F1B",
}


def stage_layers(n_layers: int, n_stages: int, stage: int) -> range:
    """The blocks of `stage` of `n_stages` (torchtitan's even split: L / n_stages each); a
    UserError where the split is not even."""
    if n_layers % n_stages:
        raise UserError(
            f"--pp: the model's {n_layers} blocks do not split evenly into {n_stages} stages "
            "(memgnn splits L / stages blocks per stage, torchtitan's "
            "pipeline_parallel_layers_per_stage)"
        )
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage must be in [0, {n_stages}), got {stage}")
    per = n_layers // n_stages
    return range(stage * per, (stage + 1) * per)


def rank_stages(pp: int, per_rank: int, rank: int) -> list[int]:
    """The stages rank `rank` holds: torchtitan's "loop" style, rank, rank + pp, ..."""
    return [rank + k * pp for k in range(per_rank)]


class DecoderStage(nn.Module):
    """One pipeline stage of a transformers decoder laid out as `LlamaForCausalLM`
    (`model.embed_tokens / layers / norm / rotary_emb`, `lm_head`): its forward is
    `LlamaModel.forward`'s, from the embeddings (first stage) or the hidden states."""

    def __init__(self, model: nn.Module, stage: int, n_stages: int):
        super().__init__()
        base = getattr(model, "model", None)
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        if (
            base is None
            or not all(hasattr(base, p) for p in parts)
            or not hasattr(model, "lm_head")
        ):
            raise UserError(
                f"--pp: {type(model).__name__} is not a decoder laid out as "
                "LlamaForCausalLM (model.embed_tokens, model.layers, model.norm, "
                "model.rotary_emb, lm_head); memgnn splits those into pipeline stages"
            )
        config = model.config
        if getattr(config, "tie_word_embeddings", False):
            raise UserError(
                f"--pp: {type(model).__name__} ties lm_head to the embeddings, which "
                "live on different stages; not modelled"
            )
        self.config = config
        self.stage, self.n_stages = stage, n_stages
        first, last = stage == 0, stage == n_stages - 1
        self.embed_tokens = base.embed_tokens if first else None
        blocks = stage_layers(len(base.layers), n_stages, stage)
        self.layers = nn.ModuleDict({str(i): base.layers[i] for i in blocks})
        self.rotary_emb = base.rotary_emb
        self.norm = base.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config, inputs_embeds=h, attention_mask=None, cache=None,
            position_ids=position_ids,
        )  # fmt: skip
        position_embeddings = self.rotary_emb(h, position_ids=position_ids)
        for layer in self.layers.values():
            h = layer(
                h, attention_mask=mask, position_embeddings=position_embeddings,
                position_ids=position_ids,
            )  # fmt: skip
        if self.norm is not None:
            h = self.lm_head(self.norm(h))
        return h


class StageParts(nn.ModuleList):
    """The model parts of a rank holding several stages (interleaved schedules), in stage
    order, as torchtitan's `model_parts`."""

    @property
    def config(self) -> Any:
        return self[0].config


def _build_stages(build: Any, stages: list[int], n_stages: int) -> nn.Module:
    model = build()
    if len(stages) == 1:
        return DecoderStage(model, stages[0], n_stages)
    return StageParts(DecoderStage(model, s, n_stages) for s in stages)


def _stage_blocks(model: nn.Module) -> list[nn.Module]:
    parts = model if isinstance(model, StageParts) else [model]
    return [block for part in parts for block in part.layers.values()]


def stage_bundle(bundle: ModelBundle, pp: int, rank: int, per_rank: int = 1) -> ModelBundle:
    """`bundle` whose `build` makes rank `rank`'s stages of `pp` ranks holding `per_rank`
    each: one `DecoderStage`, or their `StageParts`."""
    stages = rank_stages(pp, per_rank, rank)
    return replace(
        bundle,
        build=functools.partial(_build_stages, bundle.build, stages, pp * per_rank),
        blocks=_stage_blocks,
        layers=None,
        with_layers=None,
    )


def pipeline_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's `cross_entropy_loss`: logits upcast to fp32, labels pre-shifted."""
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def stage_schedule(model: nn.Module, rank: int, train: Any, device: Any,
                   group: Any) -> tuple[list[Any], Any]:  # fmt: skip
    """PyTorch's `PipelineStage`s for the rank's stages and its schedule (`--pp-schedule`):
    a single-stage schedule over one stage, a multi-stage one over the list."""
    from torch.distributed import pipelining

    p = train.parallel
    per_rank = p.pp_stages_per_rank
    parts = list(model) if isinstance(model, StageParts) else [model]
    ids = rank_stages(p.pp, per_rank, rank)
    stages = [
        pipelining.PipelineStage(part, s, p.pp * per_rank, device, group=group)
        for part, s in zip(parts, ids, strict=True)
    ]
    cls = getattr(pipelining, SCHEDULE_CLASSES[p.pp_schedule])
    first = stages if per_rank > 1 else stages[0]
    schedule = cls(first, n_microbatches=p.pp_microbatches, loss_fn=pipeline_loss)
    return stages, schedule


class _HeldWork:
    """A fake process group's P2P work that keeps its tensors referenced as long as the
    work object lives, as gloo's send and receive works do (see `peer_metadata`)."""

    __slots__ = ("tensors", "work")

    def __init__(self, work: Any, tensors: list[torch.Tensor]):
        self.work, self.tensors = work, tensors

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


@contextlib.contextmanager
def peer_metadata(boundary: torch.Tensor, gloo: bool) -> Iterator[None]:
    """The fake process group's stand-in for the other stages (module docstring): the vote
    comes out DYNAMIC, and the metadata a neighbour sends is `boundary`'s (the hidden states
    between stages; its gradient backwards). Only for a capture over the fake process
    group: a real job exchanges these itself.

    `gloo` (a CPU target): gloo's P2P work object holds its tensor until the work is
    dropped, not only until `wait()`: 1F1B's first stage keeps `send_work` (its first
    micro-batch's forward send) through the steady phase, which holds that micro-batch's
    output past its backward (one (micro-batch, S, hidden) buffer more at stage 0's peak,
    seen in the real gloo run of tests/predictor/emulate/test_pipeline.py). The fake
    group's works hold nothing; `_batch_p2p` here wraps them to hold what gloo's hold.
    NCCL (a CUDA target) stashes the tensors only until `wait()`: left as the fake works."""
    from torch.distributed.pipelining import schedules, stage
    from torch.distributed.pipelining._utils import (
        InferenceMode,
        _derive_grad_metas,
        _StageBackwardMeta,
        _StageForwardMeta,
        extract_tensor_meta,
    )

    forward = extract_tensor_meta(boundary)
    backward = _derive_grad_metas((forward,))[0]

    def warmup(self: Any, stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
        for s in stages:
            s._inference_mode = InferenceMode.DYNAMIC

    def recv_meta(self: Any, src_stage: int) -> Any:
        if src_stage < self.stage_index:
            return _StageForwardMeta(forward_metas=(forward,))
        return _StageBackwardMeta(backward_metas=(backward,))

    def send_meta(self: Any, meta: Any, dst_stage: int) -> None:
        pass

    batch_p2p = schedules._batch_p2p

    def held_p2p(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
        tensors = [op.tensor for op in p2p_ops]
        return [_HeldWork(w, tensors) for w in batch_p2p(p2p_ops, desc=desc)]

    patches: tuple[tuple[Any, str, Any], ...] = (
        (schedules._PipelineSchedule, "_warmup_p2p", warmup),
        (stage.PipelineStage, "_recv_meta", recv_meta),
        (stage.PipelineStage, "_send_meta", send_meta),
    )
    if gloo:
        patches += ((schedules, "_batch_p2p", held_p2p),)
    saved = [(cls, name, vars(cls)[name]) for cls, name, _ in patches]
    for cls, name, fn in patches:
        setattr(cls, name, fn)
    try:
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def pp_note(spec: Any) -> dict[str, Any]:
    """What `--pp` ran (`emulate.pipeline`): the stages, schedule and micro-batches."""
    p = spec.parallel
    fsdp = (
        {
            "dp": p.dp,
            "pp_fsdp": f"each stage sharded by FSDP2 over its {p.dp} data-parallel ranks "
            "(torchtitan's (pp, dp_shard) mesh: stage k on global ranks k x dp ...; each "
            "stage's first one answered, it holds the largest padded shards): fully_shard "
            "per block, then on the stage (each model part its own root), "
            f"reshard_after_forward {str(p.reshard_after_forward).lower()} "
            "(--fsdp-reshard-after-forward; torchtitan's default policy under PP is false, "
            "its 'always' true); PyTorch's PipelineStage runs every micro-batch's backward "
            "without gradient sync or reshard, so the stage's unsharded parameters and "
            "gradients stay until the step's last backward reduce-scatters them",
        }
        if p.sharding == "fsdp"
        else {}
    )
    return fsdp | {
        "pp": p.pp,
        "pp_schedule": p.pp_schedule,
        "microbatches": p.pp_microbatches,
        "pp_stages": (
            "one per rank, L/pp blocks each"
            if p.pp_stages_per_rank == 1
            else f"{p.pp_stages_per_rank} per rank (ranks r, r + pp, ...), "
            f"L/{p.pp * p.pp_stages_per_rank} blocks each"
        )
        + " (the first with the embeddings, the last with the final norm, lm_head and loss): "
        "every rank's peak is in `paths` (conditions: pipeline_stage, its stages), the answer "
        "is the worst rank's",
        "pp_assumptions": "an even split (L/pp blocks per stage); shapes inferred on the first "
        "step (stages built without example inputs, as torchtitan's); torchtitan's loss (fp32 "
        "cross entropy); P2P buffers held as gloo's works hold them on a CPU target, freed at "
        "wait() (NCCL) on a CUDA one, not checked on a GPU",
    }
