"""Fine-tuning draws: LoRA on transformers families, QLoRA and attention kernels where the
installed TrainSpec has them, from their own RNG stream."""

from __future__ import annotations

import random
from collections import Counter

import memgnn.dataset.sampler_finetune as ft
import pytest
from memgnn.dataset.sampler import SamplerConfig, sample_jobs
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

MODULES = {"attention": ["k_proj", "q_proj"], "all": ["k_proj", "q_proj", "up"], "default": []}


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.out = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _Attention()
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.mlp.up = nn.Linear(8, 4)
        self.out = nn.Linear(4, 4)  # also a name under attention: "all" only
        self.router = nn.Sequential()
        self.router.gate = nn.Linear(4, 2)
        self.norm = nn.LayerNorm(4)


def test_lora_modules_split_attention_from_the_rest():
    got = ft.lora_modules([_Block(), _Block()])
    assert got == {"attention": ["k_proj", "q_proj"], "all": ["0", "k_proj", "out", "q_proj", "up"]}


def _draws(n=400, precision="bf16", **kw):
    args = {"transformers": True, "modules": MODULES, "gpu": True, "sm": 80} | kw
    args.setdefault("kinds", ("lora",))
    base = TrainSpec.of(precision=precision).flat()
    return [ft.draw_finetune(random.Random(i), base, **args) for i in range(n)]


def test_lora_draws_are_valid_specs_with_the_models_targets():
    draws = _draws()
    lora = [d for d in draws if d]
    assert 0.2 < len(lora) / len(draws) < 0.4  # LORA_SHARE = 0.3
    assert {d["lora_r"] for d in lora} == set(ft.LORA_RANKS)
    assert {d["lora_targets"] for d in lora} == {"k_proj,q_proj", "k_proj,q_proj,up"}
    for d in lora:
        TrainSpec.of(**TrainSpec().flat() | d)
        assert d["lora_alpha"] in (d["lora_r"], 2 * d["lora_r"], 16)
    # with a peft default for the model, "" (peft's default) is one of the choices
    with_default = _draws(modules=MODULES | {"default": ["q_proj"]})
    assert "" in {d["lora_targets"] for d in with_default if d}


def test_no_lora_outside_transformers_or_without_module_names():
    assert not any(_draws(transformers=False))
    assert not any(_draws(modules=None))


def test_the_same_rng_gives_the_same_draw_and_takes_the_same_numbers():
    base = TrainSpec().flat()
    kw = {"transformers": True, "modules": MODULES, "gpu": True, "sm": 90}
    assert ft.draw_finetune(random.Random(7), base, **kw) == ft.draw_finetune(
        random.Random(7), base, **kw
    )
    a, b = random.Random(7), random.Random(7)
    ft.draw_finetune(a, base, **kw)
    ft.draw_finetune(b, base, transformers=False, modules=None, gpu=False, sm=None)
    assert a.random() == b.random()  # whatever was drawn, the stream moved alike


def test_qlora_and_attention_are_drawn_when_asked_for():
    assert not any("quantize_base" in d or "attention" in d for d in _draws())  # LoRA only
    gpu = _draws(sm=80, kinds=ft.FINETUNE_KINDS)
    quant = Counter(d.get("quantize_base") for d in gpu if "peft" in d)
    assert set(quant) == {None, "nf4", "nf4-dq", "int8"}
    assert all("quantize_base" not in d for d in gpu if "peft" not in d)
    assert Counter(d["attention"] for d in gpu).keys() == {"eager", "sdpa", "flash"}
    sm70 = _draws(sm=70, kinds=ft.FINETUNE_KINDS)
    assert {d.get("attention") for d in sm70} == {"eager", "sdpa"}  # flash: sm >= 80
    fp32 = _draws(sm=90, precision="fp32", kinds=ft.FINETUNE_KINDS)
    assert {d.get("attention") for d in fp32} == {"eager", "sdpa"}  # flash: fp16/bf16 only
    cpu = _draws(gpu=False, sm=None, kinds=ft.FINETUNE_KINDS)
    assert not any("quantize_base" in d or "attention" in d for d in cpu)
    assert any("peft" in d for d in cpu)  # LoRA runs on the CPU too
    for d in gpu:
        TrainSpec.of(**TrainSpec.of(precision="bf16").flat() | d)  # every draw is a valid spec


def test_adamw8bit_replaces_a_drawn_adam_on_gpu_only():
    assert not any("optimizer" in d for d in _draws(kinds=("lora", "qlora", "attention")))
    gpu = _draws(kinds=ft.FINETUNE_KINDS)
    eight = [d for d in gpu if d.get("optimizer") == "adamw8bit"]
    assert 0.2 < len(eight) / len(gpu) < 0.4  # ADAMW8BIT_SHARE = 0.3
    assert all(d["optimizer_impl"] == "auto" for d in eight)
    assert any("peft" in d for d in eight) and any("peft" not in d for d in eight)
    assert not any("optimizer" in d for d in _draws(gpu=False, sm=None, kinds=ft.FINETUNE_KINDS))
    sgd = TrainSpec.of(optimizer="sgd").flat()
    args = {"transformers": True, "modules": MODULES, "gpu": True, "sm": 80}
    assert not any("optimizer" in ft.draw_finetune(random.Random(i), sgd, **args)
                   for i in range(200))  # fmt: skip
    # the 8-bit draw comes last: every other draw is what it was without the kind
    before = _draws(kinds=("lora", "qlora", "attention"))
    trimmed = [{k: v for k, v in d.items() if k not in ("optimizer", "optimizer_impl")}
               for d in gpu]  # fmt: skip
    assert trimmed == before


def test_lora_share_sets_how_many_configs_are_lora():
    share = [sum("peft" in d for d in _draws(lora_share=p)) / 400 for p in (0.0, 0.7, 1.0)]
    assert share[0] == 0.0 and 0.6 < share[1] < 0.8 and share[2] == 1.0
    with pytest.raises(ValueError, match="lora_share"):
        SamplerConfig(size=4, seed=1, lora_share=1.5)


def test_only_the_kernels_a_model_takes_are_drawn():
    draws = _draws(kinds=ft.FINETUNE_KINDS, kernels=["eager", "sdpa"])
    assert {d["attention"] for d in draws} == {"eager", "sdpa"}
    assert not any("attention" in d for d in _draws(kinds=ft.FINETUNE_KINDS, kernels=[]))


def test_t5_gets_no_flash_attention_draw():
    """T5 has no flash_attention_2 in transformers: every such draw was a failed row."""
    jobs = sample_jobs(SamplerConfig(size=24, seed=2, families=["t5", "gpt2"], sizes_per_config=1,
                                     max_layers=1, lora_share=0.7))  # fmt: skip
    kernels = {(j.model, j.train["attention"]) for j in jobs}
    assert ("gpt2", "flash") in kernels and ("t5", "flash") not in kernels
    assert {k for m, k in kernels if m == "t5"} <= {"eager", "sdpa"}


def test_unknown_fine_tuning_draws_are_refused():
    with pytest.raises(ValueError, match="unknown fine-tuning draws"):
        SamplerConfig(size=4, seed=1, finetune_kinds=("dora",))


@pytest.mark.parametrize("backend", ["sim", "cpu"])
def test_sampler_draws_lora_configs_and_keeps_the_rest_of_each_config(backend):
    families = ["llama", "gpt2", "mlp"]
    on = sample_jobs(SamplerConfig(size=120, seed=2, families=families, backend=backend,
                                   sizes_per_config=2, finetune_kinds=("lora",)))  # fmt: skip
    off = sample_jobs(SamplerConfig(size=120, seed=2, families=families, backend=backend,
                                    sizes_per_config=2, finetune=False))  # fmt: skip
    lora = [j for j in on if j.train["peft"] == "lora"]
    assert lora and {j.model for j in lora} <= {"llama", "gpt2"}
    assert all(j.train["peft"] == "none" for j in off)
    base = set(TrainSpec().flat()) - {"peft", "lora_r", "lora_alpha", "lora_dropout",
                                         "lora_targets"}  # fmt: skip
    for a, b in zip(on, off, strict=True):  # same hparams, sizes and base training config
        assert (a.model, a.hparams, a.sizes, a.device) == (b.model, b.hparams, b.sizes, b.device)
        assert {k: a.train[k] for k in base} == {k: b.train[k] for k in base}
    again = SamplerConfig(size=120, seed=2, families=families, backend=backend,
                          sizes_per_config=2, finetune_kinds=("lora",))  # fmt: skip
    assert sample_jobs(again) == on
