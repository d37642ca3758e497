"""The settings behind every row of public-gpu-measurements-2.csv, as memgnn expresses them.

97 published real-GPU rows: torchtune's README tables (May 2024 resource table, Sep 2024
memory table, Nov 2024 optimization-flags table), Answer.AI fsdp_qlora's benchmarks, torchao's
low-bit optimizer and float8 training tables, torchtitan's Llama 3.1 H100 benchmarks and
Unsloth's context-length table. One `Row` per CSV id: either the row's settings in memgnn's
terms (read from a config file in the row's own framework format where the source used one:
benchmarks/configs/) or `why_not`, the named reasons it is not expressible yet, joined by
"; " from `REASONS` (the first is the row's primary reason). The FSDP1 / FSDP-QLoRA rows
(aai*, ttune21, ttune24) are public_rows.ROWS2's, unchanged.
"""

from __future__ import annotations

from typing import Any

from public_rows import (
    AAI,
    AAI_CPU_OFFLOAD,
    AAI_NOTE,
    AAI_OFFLOAD_NOTE,
    AAI_QLORA,
    BY_ID2,
    Row,
    _lora,
    row,
)

# the reasons a row is not expressible yet, by key (the summary counts them)
REASONS = {
    "contradicts": "the source contradicts itself (reported, not fitted)",
    "compile": "torch.compile with this row's other techniques not modelled (--compile "
    "blocks is, alone and with ddp/fsdp, checkpointing, adapters, torchtune's activation "
    "offloading and float8 (static shapes); not with FSDP CPU offload or a quantised base)",
    "float8": "float8 with tensor parallel (torchao's float8 TP styles) not modelled",
    "tp": "tensor parallel",
    "cp": "context parallel",
    "pp": "pipeline parallel",
    "mx": "MX (mxfp8) training not modelled",
    "torchao_nf4": "torchao NF4Tensor base weights (memgnn models bitsandbytes' nf4)",
    "cpu_offload": "CPU offload of params (FSDP) not modelled",
    "timm": "timm model (not in the catalog)",
    "lpmm": "lpmm 4-bit optimizer not modelled",
    "deepspeed": "DeepSpeed ZeRO-Offload not modelled",
    "varlen": "data-dependent length: unpacked alpaca batches, the longest not stated",
    "catalog": "model not in the catalog",
    "rocm": "an AMD MI300X (ROCm's allocator, not in the device catalog)",
}


def why(*keys: str, extra: str = "") -> str:
    return "; ".join([REASONS[k] for k in keys] + ([extra] if extra else []))


def reason_keys(text: str) -> list[str]:
    """The REASONS keys a why_not names, in order (ROWS2's own wordings mapped too)."""
    found = [k for k, v in REASONS.items() if v in text]
    if "CPUOffload" in text and "cpu_offload" not in found:
        found.append("cpu_offload")
    if "is not in" in text and "catalog" in text and "catalog" not in found:
        found.append("catalog")
    found.sort(key=lambda k: text.find(REASONS[k]) if REASONS[k] in text else len(text))
    return found or ["other"]


def not_row(id: str, *keys: str, extra: str = "", config: str = "") -> Row:
    """A row memgnn cannot express yet; `config`: its framework config all the same (what
    memgnn reads of it, the reasons warned)."""
    return row(id=id, why_not=why(*keys, extra=extra), config=config)


TT_SEP = "pytorch/torchtune@30b8519e8 README.md (memory table, Sep 2024)"
TT_NOV = "pytorch/torchtune@1814feb17 README.md (optimization flags table, Nov 2024)"
TT_MAY = "pytorch/torchtune@0217d44c2 README.md (resource table, May 2024)"
CONFIGS = "benchmarks/configs/torchtune/"
TORCHTUNE_NOTE = (
    "torchtune's own model code (memgnn captures transformers' class of the same shapes); "
    "the README's 'peak memory' does not say which statistic"
)
TT_MAY_NOTE = (
    "; an earlier version of the same README table (Mar 2024) states 'Peak memory per GPU "
    "is as reported by torch.cuda.max_memory_reserved()', from A100s capped with "
    "torch.cuda.set_per_process_memory_fraction: read as reserved"
)
UNSLOTH = "unsloth.ai/docs/basics/unsloth-benchmarks ('Hugging Face + FA2' column)"
UNSLOTH_NOTE = (
    "a boundary row: the longest padded sequence that fits the card, so the measured figure "
    "is the card's memory and memgnn's device_total should sit just under it; the setup is "
    "not stated beyond QLoRA r32 on every linear with FA2: assumed HF Trainer with "
    "transformers' gradient checkpointing, bitsandbytes nf4 with double quantisation "
    "(Unsloth's -bnb-4bit checkpoints), adamw_8bit (Unsloth's notebooks), lora_alpha 32, "
    "adapters in fp32 (peft's default); the Instruct model has the base model's shapes"
)
UNSLOTH_LORA = _lora(32, 32.0, 0.0, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")


def _unsloth(id: str, model: str, seq: int, device: str) -> Row:
    return row(
        id=id, model=model, batch=1, seq=seq, device=device, metric="device_total",
        unit="GiB", approximate=True, method="replay", source=UNSLOTH, notes=UNSLOTH_NOTE,
        precision="bf16", quantize_base="nf4-dq", attention="flash", checkpointing="hf",
        optimizer="adamw8bit", model_args={"use_cache": "false"}, **UNSLOTH_LORA,
    )  # fmt: skip


L8 = "hf:meta-llama/Llama-3.1-8B"
DINO = "hf:benchmarks/configs/hf/dinov2-giant/config.json"
TORCHAO = "pytorch/ao@03cf0ade benchmarks/benchmark_low_bit_adam.py + torchao/optim/README.md"
DINO_NOTE = (
    "timm vit_giant_patch14_dinov2.lvd142m (num_classes=45) as transformers' Dinov2 of the "
    "same shapes (facebook/dinov2-giant's config.json, benchmarks/configs/hf/: 1,134,909,485 "
    "parameters with HF's head on [CLS, mean patch]; timm's head reads [CLS] only: 69,120 "
    "fewer); images 224 x 224 (the script's RandomResizedCrop(224), not the CSV's 518: "
    "257 tokens); --full_bf16 = model.bfloat16(); timm set_grad_checkpointing = every block "
    "checkpointed; torch AdamW(fused=True); the RTX 4070 Ti SUPER 16GB has no profile: "
    "rtx4090-24gb (sm 8.9 too; allocated bytes do not depend on the card's size)"
)


def _dino(id: str, **kw) -> Row:
    kw.setdefault("precision", "bf16")
    return row(
        id=id, model=DINO, task="image-cls", model_args={"image_size": "224", "num_labels": "45"},
        batch=32, device="rtx4090-24gb", metric="allocated", unit="GB(1e9)", method="replay",
        source=TORCHAO, notes=DINO_NOTE, optimizer="adamw", optimizer_impl="fused",
        checkpointing="full", **kw,
    )  # fmt: skip


TT_NOV_NOTE = (
    "; the table logs peak active bytes, read as allocated (the same bytes outside pending "
    "cross-stream frees); A100 80GB assumed"
)


TT_SEP_NOTE = (
    "; torchtune's log_peak_memory_stats logs peak active, allocated and reserved bytes and "
    "the table does not say which: read as allocated, as torchtune's Nov 2024 table states "
    "its statistic (peak active); the README's note: batch 2 without gradient accumulation, "
    "packed to 2048, torch compile on (each decoder layer compiled, the chunked loss per "
    "chunk)"
)


def _tt_sep(id: str, config: str, device: str, what: str, extra: str = "", **kw) -> Row:
    """A row of torchtune's Sep 2024 'Memory and training speed' table (Llama 3.1 8B on one
    GPU): the recipe config at that commit in the table's form (benchmarks/configs/)."""
    return row(
        id=id, model="hf:meta-llama/Llama-3.1-8B", batch=2, seq=2048, config=CONFIGS + config,
        device=device, metric="allocated", unit="GiB", approximate=True, method="replay",
        source=TT_SEP + f" + recipes/configs/llama3_1/{what}", notes=TORCHTUNE_NOTE
        + TT_SEP_NOTE + extra, **kw,
    )  # fmt: skip


def _tt_nov(id: str, config: str, step: str) -> Row:
    """A step of torchtune's cumulative Nov 2024 optimization-flags table (Llama-3.2-3B,
    full_finetune_single_device, packed alpaca at 4096, batch 2, bf16): the config file
    the step's flags make (benchmarks/configs/torchtune/)."""
    return row(
        id=id, model="hf:meta-llama/Llama-3.2-3B", batch=2, seq=4096, config=CONFIGS + config,
        device="a100-80gb", metric="allocated", unit="GiB", approximate=True, method="replay",
        source=TT_NOV, notes=TORCHTUNE_NOTE + TT_NOV_NOTE + f"; the cumulative table's "
        f"'{step}' step (see the config file); compile: each decoder layer compiled, and the "
        "loss (training.compile_loss: the unchunked loss whole, the chunked one per chunk)",
    )  # fmt: skip


AOF8_NOTE = (
    "the same nominal config logs 47.65 / 39.09 / 33.71 GiB on H100 / MI300X / B200 (versions)"
)
AOF8_MORE = {10: ("mx",), 11: ("mx",)}  # beyond compile
TITAN_CONFIGS = "benchmarks/configs/torchtitan/"
TITAN_SRC = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
# the Grand Teton H100 96GB HBM2e: its nvidia-smi total is not published; six HBM2e stacks
# where the H100 80GB has five: 6/5 of that board's 81,559 MiB (an assumption)
H100_96GB = "custom-97870mib-sm90"


def _titan(id: str, table: str) -> Row:
    """torchtitan's Dec 2024 Llama 3.1 8B runs on H100 96GB: FSDP2 with
    MixedPrecisionPolicy(bf16, fp32), each TransformerBlock compiled, float8 tensorwise with
    the FSDP float8 all-gather and precomputed scales, read from the config file."""
    return row(
        id=id, model="hf:meta-llama/Llama-3.1-8B", config=f"{TITAN_CONFIGS}{id}.toml",
        device=H100_96GB, metric="reserved", unit="GiB", method="replay", source=TITAN_SRC,
        notes=f"{table}; torchtitan's 'memory' (max_memory_reserved, max across ranks); the "
        "H100 96GB HBM2e's capacity assumed 97,870 MiB (6/5 of the 80GB board's 81,559 "
        "MiB, not published); torchtitan's own model code (memgnn captures transformers' "
        "class of the same shapes); the loss eager (--compile-loss false): the Dec 2024 "
        "training.compile compiled the blocks only", compile_loss=False,
    )  # fmt: skip


def _aof8(k: int, *more: str) -> Row:
    """torchao's float8 table: FSDP2 with MixedPrecisionPolicy(bf16, fp32) and op-level
    selective checkpointing, compiled: not expressible with FSDP's float8 all-gather or MX
    (the config reads with a warning for them)."""
    return not_row(f"aof8{k}", *more, extra=AOF8_NOTE,
                   config=f"{TITAN_CONFIGS}aof8{k}.toml")  # fmt: skip


AOF8_SRC = "pytorch/ao docs/source/workflows/training.md (float8 / MX training table)"


def _aof8_bf16(k: int, device: str, versions: str, loss: str, **kw: Any) -> Row:
    """The table's rows memgnn expresses: torchtitan's Llama 3 8B, FSDP2 over 8 GPUs with
    MixedPrecisionPolicy(bf16, fp32), op-level selective checkpointing, each block compiled
    with static shapes (seq_len fixed), bf16 or float8 (with the FSDP float8 all-gather where
    the config asks), read from the config file."""
    return row(
        id=f"aof8{k}", model="hf:meta-llama/Llama-3.1-8B", batch=1, seq=8192,
        config=f"{TITAN_CONFIGS}aof8{k}.toml", device=device, metric="reserved", unit="GiB",
        method="replay", source=AOF8_SRC,
        notes=f"torchtitan's 'memory: X GiB' (max_memory_reserved, max over 100 steps); "
        f"{versions}; {AOF8_NOTE}; torchtitan's own model code (memgnn captures "
        f"transformers' class of the same shapes); {loss}", **kw,
    )  # fmt: skip


# fmt: off
ROWS_2: list[Row] = [
    _tt_sep("ttune1", "llama3_1_8B_full_single_device_sep2024.yaml", "rtx4090-24gb",
            "8B_full_single_device.yaml"),
    _tt_sep("ttune2", "llama3_1_8B_full_single_device_sep2024.yaml", "rtxa6000-48gb",
            "8B_full_single_device.yaml", suspect=True,
            extra="; the same config as ttune1 on a 48 GB card logs 2x the memory"),
    _tt_sep("ttune3", "llama3_1_8B_lora_single_device_sep2024.yaml", "rtx4090-24gb",
            "8B_lora_single_device.yaml"),
    _tt_sep("ttune4", "llama3_1_8B_lora_single_device_sep2024.yaml", "rtxa6000-48gb",
            "8B_lora_single_device.yaml", suspect=True,
            extra="; the same config as ttune3 on a 48 GB card logs ~2x the memory"),
    not_row("ttune5", "compile", "torchao_nf4"),
    not_row("ttune6", "compile",
            extra="its fsdp_cpu_offload alone is expressible (--fsdp-cpu-offload true)"),
    row(id="ttune7", model="hf:meta-llama/Llama-3.1-70B", batch=2, seq=2048,
        config=CONFIGS + "llama3_1_70B_lora_distributed_sep2024.yaml", gpus=8, sharding="fsdp",
        device="a100-80gb", metric="allocated", unit="GiB", approximate=True,
        method="replay", source=TT_SEP + " + recipes/configs/llama3_1/70B_lora.yaml",
        notes=TORCHTUNE_NOTE + TT_SEP_NOTE + "; lora_finetune_distributed on 8 GPUs (FSDP2 "
        "on every layer), each layer compiled over its checkpoint"),
    not_row("ttune8", "contradicts", "compile", "torchao_nf4",
            extra="README batch 2 vs the config's batch 1 x accumulation 16"),
    not_row("ttune9", "varlen"),
    row(id="ttune10", model="hf:meta-llama/Llama-3.2-3B", batch=2, seq=4096,
        config=CONFIGS + "llama3_2_3B_full_single_device_baseline.yaml",
        device="a100-80gb", metric="allocated", unit="GiB", approximate=True,
        method="replay", source=TT_NOV,
        notes=TORCHTUNE_NOTE + "; the table logs peak active bytes, read as allocated (the "
        "same bytes outside pending cross-stream frees); the cumulative table's '+ Packed "
        "Dataset' step: every later flag off (see the config file); A100 80GB assumed"),
    *[_tt_nov(id, f"llama3_2_3B_full_single_device_{name}.yaml", step)
      for id, name, step in (
          ("ttune11", "compile", "+ Compile"),
          ("ttune12", "chunked_ce", "+ Chunked Cross Entropy"),
          ("ttune13", "ac", "+ Activation Checkpointing"),
          ("ttune14", "opt_in_bwd", "+ Fuse optimizer step into backward"))],
    *[_tt_nov(id, f"llama3_2_3B_{name}.yaml", step)
      for id, name, step in (
          ("ttune15", "full_single_device_offload", "+ Activation Offloading"),
          ("ttune16", "full_single_device_adamw8bit", "+ 8-bit AdamW"),
          ("ttune17", "lora_single_device_offload", "LoRA"))],
    not_row("ttune18", "compile", "torchao_nf4"),
    not_row("ttune19", "compile", "torchao_nf4"),
    row(id="ttune20", model="hf:meta-llama/Llama-2-7b-hf", batch=4, seq=2048,
        config=CONFIGS + "llama2_7B_lora_single_device.yaml",
        device="rtx4090-24gb", metric="reserved", unit="GiB", approximate=True,
        method="replay", source=TT_MAY + " + recipes/configs/llama2/7B_lora_single_device.yaml",
        notes=TORCHTUNE_NOTE + TT_MAY_NOTE + "; unit GB read as GiB; gradient "
        "accumulation 1 (LoRA gradients only)"),
    BY_ID2["ttune21"],
    row(id="ttune22", model="hf:meta-llama/Llama-2-7b-hf", batch=4, seq=2048,
        config=CONFIGS + "llama2_7B_full_low_memory.yaml",
        optimizer="bnb.PagedAdamW", optimizer_in_bwd=True,
        device="rtx4090-24gb", metric="reserved", unit="GiB", approximate=True,
        method="replay", source=TT_MAY + " + recipes/configs/llama2/7B_full_low_memory.yaml",
        notes=TORCHTUNE_NOTE + TT_MAY_NOTE + "; unit GB read as GiB; the config's "
        "optimizer_in_bwd assumed as of May 2024; --optimizer bnb.PagedAdamW and "
        "--optimizer-in-bwd given as flags (memgnn's torchtune reader maps PagedAdamW to "
        "torch's adamw and only warns on optimizer_in_bwd): the paged states live in "
        "unified memory, outside the allocator's counts"),
    row(id="ttune23", model="hf:meta-llama/Llama-2-7b-hf", batch=4, seq=2048,
        device="rtx4090-24gb", metric="reserved", unit="GiB", approximate=True,
        method="replay", source=TT_MAY + " + recipes/configs/llama2/7B_full.yaml",
        notes=TORCHTUNE_NOTE + TT_MAY_NOTE + "; unit GB read as GiB; "
        "full_finetune_distributed of May 2024 = FSDP1 FULL_SHARD, every decoder layer "
        "wrapped and checkpointed; the CSV's PagedAdamW (bnb)",
        precision="bf16", optimizer="bnb.PagedAdamW", checkpointing="full", gpus=4,
        sharding="fsdp1", fsdp1_wrap="blocks"),
    BY_ID2["ttune24"],
    row(id="ttune25", model="hf:meta-llama/Llama-2-70b-hf", batch=4, seq=4096,
        device="a100-80gb", metric="reserved", unit="GiB", approximate=True,
        method="replay", source=TT_MAY + " + recipes/configs/llama2/70B full",
        notes=TORCHTUNE_NOTE + TT_MAY_NOTE + "; unit GB read as GiB; as ttune23 on "
        "8 A100s",
        precision="bf16", optimizer="bnb.PagedAdamW", checkpointing="full", gpus=8,
        sharding="fsdp1", fsdp1_wrap="blocks"),
    *[BY_ID2[f"aai{k}"] for k in range(1, 11)],
    row(id="aai11", model="hf:benchmarks/configs/hf/yi-34b/config.json", batch=2, seq=2048,
        device="rtx3090-24gb", metric="reserved", unit="GiB", method="replay", source=AAI,
        notes=AAI_NOTE + "; 01-ai/Yi-34B from its published config.json (benchmarks/configs/"
        "hf/yi-34b/)", model_args={"use_cache": "false"}, **AAI_QLORA),
    row(id="aai12", model="hf:benchmarks/configs/hf/yi-34b/config.json", batch=4, seq=2048,
        device="rtx3090-24gb", metric="reserved", unit="GiB", method="replay", source=AAI,
        notes=AAI_NOTE + "; 01-ai/Yi-34B from its published config.json (benchmarks/configs/"
        "hf/yi-34b/)" + AAI_OFFLOAD_NOTE, model_args={"use_cache": "false"}, **AAI_QLORA,
        **AAI_CPU_OFFLOAD),
    *[BY_ID2[f"aai{k}"] for k in range(13, 22)],
    *[not_row(f"aoopt{k}", "compile", "timm") for k in (1, 2, 3, 4, 6)],
    not_row("aoopt5", "compile", "timm", "lpmm"),
    not_row("aoopt7", "compile", "timm", "lpmm"),
    *[not_row(f"aoopt{k}", "varlen", extra="batch per torchtune 52d1b838's config, not "
              "restated") for k in (8, 9, 10, 11)],
    _dino("aoopt12"),
    not_row("aoopt13", "deepspeed"),
    _dino("aoopt14", offload_optimizer="torchao"),
    _dino("aoopt15", offload_optimizer="torchao", offload_gradients=True),
    not_row("aoopt16", "compile", "timm"),
    not_row("aoopt17", "compile", "timm"),
    _dino("aoopt18", precision="amp-bf16", offload_optimizer="torchao"),
    _aof8_bf16(1, "h100-80gb", "torch 2.7.0a0, torchtitan 0.0.2",
               "the loss eager (--compile-loss false): torchtitan 0.0.2's training.compile "
               "compiled the blocks only", compile_loss=False),
    _aof8_bf16(2, "h100-80gb", "torch 2.7.0a0, torchtitan 0.0.2; float8 tensorwise with "
               "the FSDP float8 all-gather and precomputed scales", "the loss eager "
               "(--compile-loss false): torchtitan 0.0.2's training.compile compiled the "
               "blocks only", compile_loss=False),
    _aof8_bf16(3, "h100-80gb", "torch 2.7.0a0, torchtitan 0.0.2; float8 rowwise, bf16 "
               "all-gather", "the loss eager (--compile-loss false): torchtitan 0.0.2's "
               "training.compile compiled the blocks only", compile_loss=False),
    *[not_row(f"aof8{k}", "rocm", extra=AOF8_NOTE, config=f"{TITAN_CONFIGS}aof8{k}.toml")
      for k in range(4, 8)],
    _aof8_bf16(8, "b200-180gb", "torch 2.9.0.dev20250815+cu128, power-limited B200",
               "the loss compiled as the config's compile.components ['model', 'loss'] say "
               "(assumed of the torchtitan of Aug 2025)"),
    _aof8_bf16(9, "b200-180gb", "torch 2.9.0.dev20250815+cu128, power-limited B200; "
               "float8 tensorwise", "the loss compiled as the config's compile.components "
               "['model', 'loss'] say (assumed of the torchtitan of Aug 2025)"),
    *[_aof8(k, *AOF8_MORE.get(k, ())) for k in range(10, 12)],
    _aof8_bf16(12, "b200-180gb", "torch 2.9.0.dev20250815+cu128, power-limited B200; "
               "float8 rowwise", "the loss compiled as the config's compile.components "
               "['model', 'loss'] say (assumed of the torchtitan of Aug 2025)"),
    _titan("ttitan1", "Table 1 row 3: 8 GPUs, FSDP + compile + Float8, selective (op) AC"),
    _titan("ttitan2", "Table 2: 8 GPUs, FSDP 8 x CP 1, full AC, seq 32768"),
    *[not_row(f"ttitan{k}", "cp") for k in (3, 4, 5)],
    _titan("ttitan6", "Table 3 row 3: 128 GPUs, FSDP + compile + Float8, selective (op) AC"),
    not_row("ttitan7", "float8", "tp"),
    not_row("ttitan8", "float8", "tp"),
    not_row("ttitan9", "float8", "tp", "pp"),
    not_row("ttitan10", "float8", "tp", "pp"),
    not_row("ttitan11", "float8", "tp", "pp"),
    *[not_row(f"ttitan{k}", "float8", "tp", "pp", "cp") for k in (12, 13, 14)],
    _unsloth("unsloth1", L8, 932, "rtx4090-24gb"),
    _unsloth("unsloth2", L8, 2551, "rtx4090-24gb"),
    _unsloth("unsloth3", L8, 5789, "rtx4090-24gb"),
    _unsloth("unsloth4", L8, 12264, "a100-40gb"),
    _unsloth("unsloth5", L8, 15502, "rtxa6000-48gb"),
    _unsloth("unsloth6", L8, 28454, "a100-80gb"),
    _unsloth("unsloth7", "hf:meta-llama/Llama-3.3-70B-Instruct", 6916, "a100-80gb"),
]
# fmt: on
BY_ID_2 = {r.id: r for r in ROWS_2}
assert len(BY_ID_2) == len(ROWS_2), "duplicate row ids"
