"""Named corpus recipes: `memgnn dataset build --preset NAME --out DIR`.

A preset fixes everything that decides a corpus's rows (backend, size, sizes per config,
seed, families, caps, pinned hparams, fine-tuning draws) for each of its stages, run in
order into one folder. Job ids are content hashes of the drawn configs, so two builds of
a preset with the same memgnn and torch give the same rows (labels, breakdowns, stats; not
the timings), whatever `--workers` or `--executor`; a build stopped half way is resumed by
the same command. What is left free is how it runs: `--workers`, `--executor`,
`--address`, `--chunk-size`, `--no-progress`.

- `v1`: the first corpus in the repository (packed as `dataset/data/corpus-v1` until v2
  replaced it): every zoo family at the sampler's default caps, LoRA draws on, sim labels
  on the four default GPU profiles, then real CPU steps.
- `v2`: the corpus of the shipped GNN (`dataset/data/corpus-v2`): v1's two stages, row
  for row, then a fine-tuning stage: sim labels for the transformers families at two
  layers, where 70% of the configs are LoRA, 40% of those on a GPU profile QLoRA (nf4,
  nf4-dq, int8), the attention kernel drawn (eager / sdpa / flash from sm 80) and 30% of
  the Adam / AdamW configs on bitsandbytes' 8-bit AdamW.
- `readme-3960`: the recipe the README gives for the corpus of the GNN shipped before
  corpus-v1 (sim 3,960 jobs at 12 sizes per config, then cpu 430 jobs, seed 1), without
  fine-tuning draws. Today's code draws and labels it anew: its rows are not the lost
  original's, and it takes hours on two cores (capture is ~90% of the time).
- `smoke`: two tiny models at two sizes per config, a minute on one core; for tests and
  for checking that a machine builds identical rows.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from memgnn.dataset.sampler import CAPS
from memgnn.dataset.sampler_finetune import FINETUNE_KINDS, LORA_SHARE

__all__ = ["PRESETS", "PRESET_FIXED", "Stage", "check_preset_flags", "preset_kwargs"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Stage:
    """One `dataset build` run of a preset."""

    backend: str
    size: int
    sizes_per_config: int
    seed: int
    families: tuple[str, ...] | None = None  # None: every zoo family
    caps: dict[str, int] = field(default_factory=dict)
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)
    finetune: bool = True
    finetune_kinds: tuple[str, ...] = FINETUNE_KINDS
    lora_share: float = LORA_SHARE

    def __post_init__(self) -> None:
        if self.size < 1 or self.sizes_per_config < 1:
            raise ValueError("a preset stage needs size >= 1 and sizes_per_config >= 1")


V2_FINETUNE_SIZE = 320  # 40 configs at 8 sizes
_SMOKE_HP = {
    "mlp": {"features": 64, "hidden": 128, "layers": 2, "classes": 10},
    "gpt2": {"layers": 1, "hidden": 64, "heads": 2, "vocab": 256},
}
_SMOKE_CAPS = {"max_tokens": 128, "max_batch": 4}

_V1 = (
    # built when LoRA was the only fine-tuning draw: QLoRA / attention draws stay off
    Stage(backend="sim", size=264, sizes_per_config=12, seed=1, finetune_kinds=("lora",)),
    Stage(backend="cpu", size=60, sizes_per_config=3, seed=1, finetune_kinds=("lora",)),
)
_FINETUNE_FAMILIES = ("gpt2", "llama", "bert", "t5", "vit")  # mixtral: data-dependent routing
PRESETS: dict[str, tuple[Stage, ...]] = {
    "v1": _V1,
    "v2": (
        *_V1,
        Stage(
            backend="sim",
            size=V2_FINETUNE_SIZE,
            sizes_per_config=8,
            seed=2,
            families=_FINETUNE_FAMILIES,
            caps={"max_layers": 2, "max_params": 30_000_000},
            finetune_kinds=FINETUNE_KINDS,
            lora_share=0.7,
        ),
    ),
    "readme-3960": (
        Stage(backend="sim", size=3960, sizes_per_config=12, seed=1, finetune=False),
        Stage(backend="cpu", size=430, sizes_per_config=12, seed=1, finetune=False),
    ),
    "smoke": (
        Stage(
            backend="sim",
            size=4,
            sizes_per_config=2,
            seed=0,
            families=("mlp", "gpt2"),
            caps=_SMOKE_CAPS,
            hparams=_SMOKE_HP,
        ),  # fmt: skip
        Stage(
            backend="cpu",
            size=2,
            sizes_per_config=1,
            seed=0,
            families=("mlp",),
            caps=_SMOKE_CAPS,
            hparams=_SMOKE_HP,
        ),  # fmt: skip
    ),
}
# BuildConfig fields a preset decides: setting one of them beside --preset is an error
PRESET_FIXED = (
    "size",
    "backend",
    "sizes_per_config",
    "seed",
    "families",
    "caps",
    "hparams",
    "finetune",
    "finetune_kinds",
    "lora_share",
    "devices",
)


# the CLI options a preset decides: argparse dest -> flag
_PRESET_FLAGS = {
    "size": "--size",
    "backend": "--backend",
    "seed": "--seed",
    "sizes_per_config": "--sizes-per-config",
    "families": "--families",
    "devices": "--devices",
    "hparam": "--hparam",
    "no_finetune": "--no-finetune",
} | {cap: "--" + cap.replace("_", "-") for cap in CAPS["sim"]}


def check_preset_flags(args: argparse.Namespace) -> None:
    """ValueError naming the options given beside `--preset` that it decides itself."""
    given = [flag for dest, flag in _PRESET_FLAGS.items() if getattr(args, dest, None)]
    if given:
        raise ValueError(f"--preset {args.preset} fixes {', '.join(given)}; drop those options")


def preset_kwargs(name: str, **run: Any) -> list[dict[str, Any]]:
    """The BuildConfig keyword arguments of each stage of preset `name`; `run`: the free
    fields (out, workers, executor, ray_address, chunk_size, progress, ...)."""
    if name not in PRESETS:
        raise ValueError(f"unknown --preset {name!r}; expected one of {', '.join(PRESETS)}")
    fixed = sorted(set(run) & set(PRESET_FIXED))
    if fixed:
        raise ValueError(f"--preset {name} fixes {', '.join(fixed)}; drop those options")
    return [
        {
            "backend": s.backend,
            "size": s.size,
            "sizes_per_config": s.sizes_per_config,
            "seed": s.seed,
            "families": list(s.families) if s.families else None,
            "caps": dict(s.caps),
            "hparams": {k: dict(v) for k, v in s.hparams.items()},
            "finetune": s.finetune,
            "finetune_kinds": s.finetune_kinds,
            "lora_share": s.lora_share,
        }
        | run
        for s in PRESETS[name]
    ]
