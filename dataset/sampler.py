"""The corpus config sampler: seeded, stratified draws of (model, sizes, training config).

A *config* is one zoo model with drawn hparams, one TrainSpec (precision x optimizer and its
implementation x checkpointing x grad accumulation) and one device profile; each config is
profiled at `sizes_per_config` distinct input sizes, so its symbolic graph is captured once
and shared by those jobs. Configs go round-robin over the families, so every family gets
about size / len(families) jobs.

Configs also go round-robin over the devices (`config_device`: balanced overall and, over
a few rounds, per family), so a small corpus already covers every device profile.

Config `i` is drawn from its own RNG (seeded by (seed, i)), so a larger `size` with the
same seed keeps every job of the smaller one: growing a corpus resumes it. A job's id is
the sha1 of its canonical JSON config, so the same config always gets the same id.

Configs of the transformers families also draw LoRA, QLoRA and the attention kernel
(`dataset.sampler_finetune`, from a separate RNG stream; `finetune=False` turns it off).

Only configs that can run are drawn: a draw that `skip_reason` rejects (bf16 on a device
without bfloat16, checkpointing a model without repeated blocks, a fused optimizer the
installed torch lacks, fp16 convolutions on the CPU, whose reference kernel takes minutes
per step) is redrawn from the config's next RNG, like an invalid hparam combination. Only
where the device is unknown before the run (`cuda` with `auto`) can a job still carry a
`skip` reason, which the builder stores as an error row.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from memgnn.dataset.sampler_finetune import (
    FINETUNE_KINDS,
    LORA_SHARE,
    attention_kernels,
    draw_finetune,
    lora_modules,
    peft_default,
)
from memgnn.predictor.spec.choices import OPTIMIZER_IMPLS, PRECISIONS, TORCH_OPTIMIZERS
from memgnn.predictor.spec.devices import PROFILES
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

BACKENDS = ("sim", "cpu", "cuda")
DEFAULT_SIM_DEVICES = ("a100-80gb", "h100-80gb", "a10g-24gb", "v100-16gb")
GRAD_ACCUM = (1, 2, 4)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SEQS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Caps per backend: cpu runs are real steps on this machine's CPU and must stay small.
# `max_static_seq` caps sequence dims a model declares static (e.g. nn.LSTM): their step is
# unrolled per time step under fake tensors, so capture cost grows with the length.
CAPS: dict[str, dict[str, int | None]] = {
    "sim": {
        "max_tokens": 65536,
        "max_batch": 256,
        "max_image": 224,
        "max_params": None,
        "max_static_seq": 64,
        "max_layers": None,
    },
    "cpu": {
        "max_tokens": 512,
        "max_batch": 8,
        "max_image": 64,
        "max_params": 4_000_000,
        "max_static_seq": 32,
        "max_layers": None,
    },
    "cuda": {
        "max_tokens": 32768,
        "max_batch": 128,
        "max_image": 224,
        "max_params": None,
        "max_static_seq": 256,
        "max_layers": None,
    },
}
_MAX_DRAWS = 20  # redraws of a config that is invalid, over the caps, or already drawn


@dataclass(kw_only=True, slots=True)
class SamplerConfig:
    size: int
    seed: int = 0
    families: list[str] | None = None  # zoo names; default: all
    backend: str = "sim"
    devices: list[str] | None = None  # sim: GPU profiles; cpu: ["cpu"]; cuda: ["auto"]
    sizes_per_config: int = 4
    max_tokens: int | None = None  # B*S (+ B*T) per micro-batch; defaults from CAPS
    max_batch: int | None = None
    max_image: int | None = None  # cap on an `image` hparam
    max_params: int | None = None
    max_static_seq: int | None = None
    max_layers: int | None = None  # cap on a `layers` hparam (cheap corpora: tests, demos)
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)  # pinned, per zoo name
    finetune: bool = True  # draw LoRA / QLoRA / attention kernels (dataset.sampler_finetune)
    finetune_kinds: tuple[str, ...] = FINETUNE_KINDS  # which of them
    lora_share: float = LORA_SHARE  # of the configs of a transformers family

    def __post_init__(self) -> None:
        from memgnn.predictor.spec.devices import PROFILES
        from memgnn.predictor.zoo import FAMILIES

        if not 0.0 <= self.lora_share <= 1.0:
            raise ValueError(f"lora_share must be in [0, 1], got {self.lora_share}")
        unknown_kinds = set(self.finetune_kinds) - set(FINETUNE_KINDS)
        if unknown_kinds:
            raise ValueError(
                f"unknown fine-tuning draws {sorted(unknown_kinds)}; expected {FINETUNE_KINDS}"
            )

        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"size must be an int >= 0, got {self.size!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        if self.families is None:
            self.families = list(FAMILIES)
        if not self.families:
            raise ValueError("families must not be empty")
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown families {unknown}; valid zoo names: {', '.join(FAMILIES)}")
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"duplicate families in {self.families}")
        if self.devices is None:
            default = {"sim": DEFAULT_SIM_DEVICES, "cpu": ("cpu",), "cuda": ("auto",)}
            self.devices = list(default[self.backend])
        if not self.devices:
            raise ValueError("devices must not be empty")
        for dev in self.devices:
            if self.backend == "cuda" and dev == "auto":
                continue
            if dev not in PROFILES:
                raise ValueError(f"unknown device profile {dev!r}; known: {', '.join(PROFILES)}")
            gpu = PROFILES[dev].is_gpu
            if self.backend == "cpu" and gpu or self.backend != "cpu" and not gpu:
                raise ValueError(f"device {dev!r} does not fit the {self.backend} backend")
        if self.sizes_per_config < 1:
            raise ValueError("sizes_per_config must be >= 1")
        for cap, default in CAPS[self.backend].items():
            value = getattr(self, cap)
            if value is None:
                setattr(self, cap, default)
            elif value < 1:
                raise ValueError(f"{cap} must be >= 1, got {value}")
        for name, pins in self.hparams.items():
            if name not in FAMILIES:
                raise ValueError(f"hparams pinned for unknown family {name!r}")
            FAMILIES[name].hparams(pins)  # unknown keys: ValueError


@dataclass(kw_only=True, slots=True, frozen=True)
class Job:
    """One profiling job, in plain data (it travels to worker processes and Ray tasks)."""

    job_id: str
    group: str  # jobs of one config (all but sizes) share a group and a symbolic graph
    family: str  # the family label (leave-family-out splits group by it)
    model: str  # zoo name
    hparams: dict[str, Any]
    sizes: dict[str, int]
    train: dict[str, Any]  # TrainSpec fields
    backend: str
    device: str
    skip: str | None = None  # why the config cannot run; None if it can

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(**data)


# TrainSpec's fields when job ids were first written (corpus-v1). A field added since
# enters a job's id only when it differs from its default, so adding a TrainSpec field
# keeps every existing id: a resumed build does not redo its finished jobs, and the
# repository's corpus stays the preset's.
_ID_TRAIN_FIELDS = frozenset(
    "precision optimizer optimizer_impl lr checkpointing grad_accum set_to_none steps "
    "peft lora_r lora_alpha lora_dropout lora_targets".split()
)


def _id_train(train: dict[str, Any]) -> dict[str, Any]:
    defaults = TrainSpec().flat()
    return {
        k: v for k, v in train.items() if k in _ID_TRAIN_FIELDS or v != defaults.get(k, object())
    }


def canonical_id(config: dict[str, Any]) -> str:
    """sha1 of the canonical JSON of a config (its `train` as `_id_train` keeps it)."""
    if isinstance(config.get("train"), dict):
        config = config | {"train": _id_train(config["train"])}
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()


def sample_jobs(cfg: SamplerConfig) -> list[Job]:
    """`cfg.size` distinct jobs, configs round-robin over the families (see module doc)."""
    jobs: list[Job] = []
    seen_groups: set[str] = set()
    index = 0
    while len(jobs) < cfg.size:
        name = cfg.families[index % len(cfg.families)]
        device = config_device(cfg, index)
        for attempt in range(_MAX_DRAWS):
            rng = random.Random(f"{cfg.seed}:{index}:{attempt}")
            ft_rng = random.Random(f"{cfg.seed}:{index}:{attempt}:finetune")
            drawn = _draw_config(cfg, name, device, rng, ft_rng)
            if drawn is not None and drawn[0].group not in seen_groups:
                break
        else:
            log.warning("config %d (%s): no new valid config in %d draws", index, name, _MAX_DRAWS)
            index += 1
            continue
        seen_groups.add(drawn[0].group)
        jobs.extend(drawn[: cfg.size - len(jobs)])
        index += 1
    skipped = sum(j.skip is not None for j in jobs)
    log.info("sampled %d jobs (%d skipped) from %d configs", len(jobs), skipped, index)
    return jobs


def config_device(cfg: SamplerConfig, index: int) -> str:
    """The device of config `index`: round-robin over `cfg.devices`, shifted by one after
    every lcm(families, devices) configs. Every block of that many configs is balanced
    over the devices, and a family, whose configs are every len(families)-th, moves
    through every device over gcd(families, devices) blocks."""
    n, k = len(cfg.devices), len(cfg.families)
    block = index // math.lcm(n, k)
    return cfg.devices[(index + block) % n]


def _draw_config(
    cfg: SamplerConfig, name: str, device: str, rng: random.Random, ft_rng: random.Random
) -> list[Job] | None:
    """The jobs of one config on `device`, or None when the draw is not a valid config or
    cannot run there (the caller redraws)."""
    from memgnn.predictor.zoo import get_family

    family = get_family(name)
    hp = {key: rng.choice(_capped(cfg, key, choices)) for key, choices in family.ranges.items()}
    hp = family.hparams(hp | cfg.hparams.get(name, {}))
    facts = model_facts(name, _freeze(hp))
    if facts is None:
        return None  # invalid hparam combination
    if cfg.max_params is not None and facts["params"] > cfg.max_params:
        return None
    train, skip = _draw_train(cfg, rng, facts, device)
    if cfg.finetune:
        profile = PROFILES.get(device)
        extra = draw_finetune(
            ft_rng,
            train,
            transformers=family.source == "transformers",
            modules=facts["lora_modules"],
            gpu=device == "auto" or profile is not None and profile.is_gpu,
            sm=profile.sm if profile is not None else None,
            kinds=tuple(cfg.finetune_kinds),
            lora_share=cfg.lora_share,
            kernels=facts["attention_kernels"],
        )
        train = TrainSpec.of(**train | extra).flat()
    if skip is not None and device in PROFILES:  # known not to run: redraw
        log.debug("config of %s on %s redrawn: %s", name, device, skip)
        return None
    base = {
        "model": name,
        "hparams": hp,
        "train": train,
        "backend": cfg.backend,
        "device": device,
    }
    group = canonical_id(base)
    jobs = []
    for sizes in _draw_sizes(cfg, family.dims, hp, facts["static"], rng):
        jobs.append(
            Job(
                job_id=canonical_id(base | {"sizes": sizes}),
                group=group,
                family=family.family,
                model=name,
                hparams=hp,
                sizes=sizes,
                train=train,
                backend=cfg.backend,
                device=device,
                skip=skip,
            )
        )
    return jobs


def _capped(cfg: SamplerConfig, key: str, choices: list[Any]) -> list[Any]:
    cap = {"image": cfg.max_image, "layers": cfg.max_layers}.get(key)
    if cap is None:
        return choices
    return [c for c in choices if c <= cap] or [min(choices)]


def _freeze(hp: dict[str, Any]) -> str:
    return json.dumps(hp, sort_keys=True, default=str)


@functools.lru_cache(maxsize=4096)
def model_facts(name: str, frozen_hparams: str) -> dict[str, Any] | None:
    """Parameter count, repeated-block count, static dims and whether it convolves
    (meta-device build); None if the hparams are not a valid config."""
    import torch
    from memgnn.predictor.spec.bundle import default_blocks
    from memgnn.predictor.zoo import make_bundle

    try:
        bundle = make_bundle(name, json.loads(frozen_hparams))
        with torch.device("meta"):
            model = bundle.build()
    except ValueError as exc:
        log.debug("%s %s is not a valid config: %s", name, frozen_hparams, exc)
        return None
    blocks = (bundle.blocks or default_blocks)(model)
    modules = lora_modules(blocks) | {"default": peft_default(model)}
    kernels = attention_kernels(model) if hasattr(model, "config") else []
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "blocks": len(blocks),
        "static": tuple(getattr(bundle, "static_dims", ())),
        "conv": any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()),
        "lora_modules": modules,
        "attention_kernels": kernels,
    }


def _draw_train(
    cfg: SamplerConfig, rng: random.Random, facts: dict[str, Any], device: str
) -> tuple[dict[str, Any], str | None]:
    blocks = facts["blocks"]
    precision = rng.choice(PRECISIONS)
    optimizer = rng.choice(TORCH_OPTIMIZERS)
    impls = [i for i in OPTIMIZER_IMPLS if not (optimizer == "adafactor" and i == "fused")]
    impl = rng.choice(impls)
    r = rng.random()
    if r < 0.5:
        checkpointing = "none"
    elif r < 0.75 or blocks < 2:
        checkpointing = "full"
    else:
        checkpointing = f"blocks:{rng.randint(1, blocks - 1)}"
    train = TrainSpec.of(
        precision=precision,
        optimizer=optimizer,
        optimizer_impl=impl,
        checkpointing=checkpointing,
        grad_accum=rng.choice(GRAD_ACCUM),
    )
    return train.flat(), skip_reason(train, blocks, device, conv=facts["conv"])


def skip_reason(train: TrainSpec, blocks: int, device: str, *, conv: bool = False) -> str | None:
    """Why (train, device) cannot run on a model with `blocks` repeated blocks (and
    convolutions if `conv`), or None."""
    import torch
    from memgnn.predictor.spec.devices import PROFILES

    profile = PROFILES.get(device)
    if profile is not None and "bf16" in train.numerics.precision and not profile.bf16:
        return f"{train.numerics.precision} needs bfloat16, which {device} (sm {profile.sm}) lacks"
    n = train.activations.checkpoint_blocks
    if n is not None and blocks == 0:
        return "checkpointing needs repeated blocks; the model has none"
    if n is not None and n > blocks:
        return f"checkpointing {n} blocks; the model has {blocks}"
    on_cpu = profile is not None and not profile.is_gpu
    if on_cpu and conv and "fp16" in train.numerics.precision:
        return "fp16 convolutions on the CPU run a slow reference kernel (~100x fp32)"
    if train.optim.impl == "fused":
        if train.optim.name == "adafactor":
            return "adafactor has no fused implementation"
        if on_cpu and _torch_version() < (2, 4):
            return f"fused {train.optim.name} on CPU needs torch >= 2.4 (have {torch.__version__})"
    return None


def _torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _draw_sizes(
    cfg: SamplerConfig,
    dims: dict[str, int],
    hp: dict[str, Any],
    static: tuple[str, ...],
    rng: random.Random,
) -> list[dict[str, int]]:
    """Up to `sizes_per_config` distinct sizes within the caps (tokens, batch, positions)."""
    seq_dims = [d for d in dims if d != "B"]
    max_seq = hp.get("max_positions") or SEQS[-1]
    if any(d in static for d in seq_dims):
        max_seq = min(max_seq, cfg.max_static_seq)
    seqs = [s for s in SEQS if s <= max_seq] or [SEQS[0]]
    batches = [b for b in BATCHES if b <= cfg.max_batch] or [1]
    out: list[dict[str, int]] = []
    for _ in range(cfg.sizes_per_config * 4):
        sizes = {d: rng.choice(seqs) for d in seq_dims}
        per_sample = sum(sizes.values()) or 1
        fits = [b for b in batches if b * per_sample <= cfg.max_tokens]
        if not fits:
            continue
        sizes = {"B": rng.choice(fits), **sizes}
        if sizes not in out:
            out.append(sizes)
        if len(out) == cfg.sizes_per_config:
            break
    if not out:  # the smallest sizes, even if over the token cap
        out.append({"B": 1, **{d: seqs[0] for d in seq_dims}})
    return out
