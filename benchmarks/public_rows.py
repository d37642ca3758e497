"""The settings behind every row of the public GPU measurements, as memgnn expresses them.

One `Row` per row id of public-gpu-measurements.csv: the memgnn model spec and training
config taken from the row's own sources, and where each setting came from. Sources read
(pinned commits):
- LitGPT (github.com/Lightning-AI/litgpt @ 26857050): config_hub/finetune/<model>/
  {lora,qlora,full}.yaml (lora_r, lora_alpha, lora_dropout, lora_query/key/value/
  projection/mlp/head, micro_batch_size, global_batch_size, max_seq_length, precision,
  quantize, devices), litgpt/finetune/{full,lora}.py (what runs and what is measured:
  `torch.cuda.max_memory_allocated() / 1e9` in utils.create_finetuning_performance_report,
  over the whole run; gradient accumulation = global_batch_size / (micro_batch_size x
  devices); multi-device full fine-tuning = FSDPStrategy(FULL_SHARD default,
  activation_checkpointing_policy={Block}); QLoRA's optimizer = bnb.optim.PagedAdamW),
  litgpt/model.py (SDPA with is_causal, K/V heads repeat_interleave'd to the query heads,
  fused qkv Linear), litgpt/lora.py (LoRAQKVLinear: one A of r x (#enabled of q/k/v) rows
  on the fused qkv input), litgpt/utils.py (chunked_cross_entropy, chunks of 128 rows).
- rasbt/pytorch-memory-optim @ HEAD: 01_pytorch-vit.py .. 05_gradient-accum.py (torchvision
  vit_l_16 IMAGENET1K_V1, heads.head -> Linear(1024, 10), torch.optim.Adam(lr=5e-5),
  batch 64 / 16 / 4x4, Fabric precision, `torch.cuda.max_memory_reserved() / 1e9`), logs.md.
- huggingface/peft @ 5d602fdb: README.md (T0_3B table), examples/conditional_generation/
  peft_lora_seq2seq_accelerate_ds_zero3_offload.py (batch_size 8, LoraConfig r=8,
  lora_alpha=32, lora_dropout=0.1, AdamW, TorchTracemalloc: max_memory_allocated in MiB).
- PyTorch tutorial optimizer_step_in_backward_tutorial (vit6/vit7), torchtitan
  benchmarks/llama3_h100_202412_torchtitan.md (ttitan rows), as the CSV cites them.

What LitGPT does differently, and which of it memgnn models: `DIFFERENCES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memgnn.predictor.spec.train import BY_NAME, TrainSpec

DIFFERENCES = """\
LitGPT runs its own model code, not Hugging Face's; memgnn captures the HF class of the
same published config (catalog `hf:ORG/NAME`). Modelled (mapped onto memgnn options):
- bf16-true = parameters, gradients and optimizer states all in bf16: `--precision bf16`.
- Gradient accumulation = global_batch_size / (micro_batch_size x devices) from each yaml:
  full fine-tunes run it (gradients live through every micro-step); LoRA rows run 1 (their
  gradients are the adapters' only, tens of MB) to keep 7B captures to one micro-step.
- LoRA on LitGPT's fused qkv (LoRAQKVLinear): lora_query + lora_value on HF models with
  separate projections (Llama, Mistral, Gemma, Phi-2) -> peft on q_proj, v_proj: the same
  adapter shapes. Where HF fuses qkv too (Falcon and GPT-NeoX query_key_value, Phi-3
  qkv_proj) peft puts one adapter on the whole fused output: B also spans k (Falcon-7b:
  +32 x 64 per layer) and A has r rows, not r x #enabled (Phi-3: 2 x 8 x 3072 fewer per
  layer). lora_projection -> o_proj / dense, lora_mlp -> gate/up/down_proj (fc1/fc2,
  gate_up_proj), lora_head -> lm_head. lora_dropout as in the yaml.
- LoRA adapters' dtype: LitGPT's LoRALinear creates lora_A / lora_B under Fabric's
  init_module, in the model's dtype (bf16-true), and runs lora_dropout(x) @ A.T @ B.T on
  the bf16 input -> `--lora-dtype model` (peft with autocast_adapter_dtype=False: no fp32
  upcast of adapters or of each adapted module's input; peft's default upcasts both).
- QLoRA `quantize: bnb.nf4` -> `--quantize-base nf4` (bitsandbytes Linear4bit storages and
  their dequantised temporaries); several devices -> `--gpus N --sharding fsdp` (LitGPT's
  FSDPStrategy: FULL_SHARD) with `--checkpointing full` (activation_checkpointing_policy
  {Block}) and `--grad-sync last`: full.py runs every accumulating micro-step under
  `fabric.no_backward_sync` (FSDP1 `no_sync()`), so each rank keeps the whole model's
  unsharded gradients until the last micro-step (FSDP2 set_requires_gradient_sync(False),
  its stated equivalent, is what memgnn captures).
- Phi-2's activation: HF's config asks for gelu_new, which transformers runs as a Python
  formula (pow, mul, add, tanh: several saved T x I intermediates per layer); LitGPT's
  config (gelu_approximate="tanh") calls the fused F.gelu(approximate="tanh"), the same
  function, which saves its input only -> `--model-arg hidden_act=gelu_pytorch_tanh`
  (transformers' name for that fused call).
- Tied embeddings: LitGPT's GPT always has its own lm_head, and convert_hf_checkpoint copies
  the input embedding into it where HF ties them (Gemma, Gemma-2, Falcon) ->
  `--model-arg tie_word_embeddings=false` for those rows (Gemma-2b: +256,000 x 2,048 bf16
  parameters).
- QLoRA's bitsandbytes: the README table's runs (43c44323, Apr 2024; QLoRA rows redone in
  e5493986, Jul 2024) had pyproject.toml pin bitsandbytes==0.42.0, whose MatMul4Bit kept
  every 4-bit matmul's input A as `ctx.tensors` (a ctx attribute, never read by backward;
  bitsandbytes PR #1270, "fix QLoRA mem bug: delete useless buffered activation", 0.43.2)
  -> `--bnb-version 0.42.0`. And fit() binds `logits = model(input_ids, ...)`: the last
  micro-step's logits, and through their grad_fn its autograd graph with those A's, live
  until the next forward returns -> `--hold-outputs` (every LitGPT row: the held bf16
  logits, B x S x V, through backward and into the next forward), with
  `--model-arg use_cache=false` (LitGPT's GPT keeps no KV cache in training; HF's model
  would return one in its outputs).
Not modelled (memgnn captures HF's code):
- LitGPT's RMSNorm keeps an fp32 x and an fp32 normalized copy (HF: fp32 x, bf16 copy);
  LitGPT repeats K/V heads to all query heads before SDPA (GQA and Falcon's MQA: 71 heads),
  HF passes enable_gqa; Gemma-2's logit softcapping makes LitGPT's attention materialise
  the scores; LitGPT's lm_head output stays bf16 with a 128-row chunked cross entropy (and
  chunks of 128 positions for the LoRA script's lm_head), HF upcasts logits to fp32.
- LoRA's dropout: LitGPT applies it once per fused qkv input, peft once per adapted q, k,
  v module (each saves its own mask and output); LitGPT also zero-pads the fused LoRA
  output to the qkv width.
- QLoRA: LitGPT's BitsandbytesPrecision quantises every Linear, lm_head included (HF keeps
  lm_head in bf16); its optimizer is bnb PagedAdamW, whose paged states live in CUDA unified
  memory outside max_memory_allocated (memgnn: torch AdamW states for the adapters).
- When the held graph goes: LitGPT rebinds `logits` as the next forward returns, before
  its cross entropy; memgnn frees the held loss after the next loss is computed (the plain
  loop's `loss = model(**b).loss`), through the cross entropy: high by what that holds.
- FSDP1 vs FSDP2: LitGPT wraps each Block in FSDP1 with flat parameters; memgnn captures
  FSDP2's per-parameter sharding. Not checked beyond the gradient accumulation above.
- The measured peak is over the whole run: validation passes and the example generation
  (no_grad, KV cache) besides the training steps; memgnn predicts the training step.
"""
LITGPT = "Lightning-AI/litgpt@26857050 config_hub/finetune/"
# catalog models whose HF config ties lm_head to the input embedding (GemmaConfig and
# FalconConfig default tie_word_embeddings=True); LitGPT's GPT always has a separate lm_head
HF_TIED = frozenset(
    {"hf:google/gemma-2b", "hf:google/gemma-7b", "hf:google/gemma-2-9b", "hf:tiiuae/falcon-7b"}
)
LLAMA_ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"
QV = "q_proj,v_proj"


@dataclass(kw_only=True, slots=True)
class Row:
    """memgnn's reading of one CSV row. `why_not` set: memgnn cannot express it (one line).
    `train` holds the row's training options by their flat names (`predictor.spec.train`),
    only those that differ from the defaults; `row(...)` sorts keyword arguments into them."""

    id: str
    model: str = ""
    task: str | None = None
    model_args: dict[str, str] = field(default_factory=dict)
    batch: int = 1
    seq: int | None = None
    dims: dict[str, int] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    device: str = "a10g-24gb"
    metric: str = "allocated"
    unit: str = "GB(1e9)"  # how the measured figure in the CSV is to be read
    approximate: bool = False
    suspect: bool = False  # the figure contradicts its own setup by hand (see notes)
    method: str = "analytic"
    config: str = ""  # a framework config file (repository-relative) read by --config
    source: str = ""
    notes: str = ""
    why_not: str = ""

    @property
    def spec(self) -> TrainSpec:
        return TrainSpec.of(**self.train)


def row(**kw: Any) -> Row:
    """A Row: the keywords that name a training option (`TrainSpec.of`'s flat names, and
    `zero_grad="zero"` for set_to_none=False as the CLI spells it) go to `train`."""
    if "zero_grad" in kw:
        kw["set_to_none"] = kw.pop("zero_grad") == "none"
    train = {k: kw.pop(k) for k in list(kw) if k in BY_NAME}
    TrainSpec.of(**train)  # a row's options are a valid spec
    return Row(**kw, train=train)


def _lit(id: str, model: str, yaml: str, batch: int, accum: int, **kw) -> Row:
    """A LitGPT row: bf16-true, padded length 512; its LoRA adapters are LitGPT's own,
    created in the model's dtype (bf16) under Fabric's init_module: --lora-dtype model; on
    several GPUs its full.py accumulates under `fabric.no_backward_sync` (FSDP1 `no_sync`,
    unsharded gradients kept until the last micro-step): --grad-sync last."""
    if kw.get("peft", "none") != "none":
        kw.setdefault("lora_dtype", "model")
    if kw.get("gpus", 1) > 1:  # is_accumulating micro-steps run under fabric.no_backward_sync
        kw.setdefault("grad_sync", "last")
    # fit() binds `logits = model(input_ids, ...)`: the last micro-step's logits, and through
    # their grad_fn its whole autograd graph, live until the next forward returns; LitGPT's
    # GPT returns logits alone (no KV cache in training): HF's cache off, or the held outputs
    # would hold every layer's keys and values too
    kw.setdefault("hold_outputs", True)
    kw.setdefault("model_args", {"use_cache": "false"})
    if model in HF_TIED:  # LitGPT's GPT has its own lm_head: convert_hf_checkpoint copies wte
        kw["model_args"] = kw["model_args"] | {"tie_word_embeddings": "false"}
    if model == "hf:microsoft/phi-2":  # LitGPT: gelu_approximate="tanh", the fused F.gelu
        kw["model_args"] = kw["model_args"] | {"hidden_act": "gelu_pytorch_tanh"}
    if kw.get("quantize_base"):  # pyproject.toml pinned bitsandbytes==0.42.0 when the
        kw.setdefault("bnb_version", "0.42.0")  # README table was measured (43c44323, e5493986)
    return row(
        id=id, model=model, batch=batch, seq=512, precision="bf16", grad_accum=accum,
        source=LITGPT + yaml, **kw,
    )  # fmt: skip


def _lora(r: int, alpha: float, dropout: float, targets: str) -> dict:
    return {
        "peft": "lora", "lora_r": r, "lora_alpha": alpha, "lora_dropout": dropout,
        "lora_targets": targets,
    }  # fmt: skip


VIT = "hf:google/vit-large-patch16-224"
RASBT = "rasbt/pytorch-memory-optim@HEAD "
ZERO_GRAD_NOTE = (
    "; the script calls optimizer.zero_grad() between the forward and backward, so the "
    "previous step's gradients live through every forward: memgnn --zero-grad zero (kept "
    "zeroed gradients) holds the same bytes there"
)
VIT_NOTE = (
    "HF ViTForImageClassification stands in for torchvision vit_l_16 (torchvision is not "
    "installable here): same shapes and 303,311,882 parameters with the 10-class head; "
    "torchvision runs nn.MultiheadAttention (fused in_proj, SDPA inside), HF separate q/k/v "
    "Linear + SDPA; A100 assumed (a100-80gb profile)"
)
T0_NOTE = (
    "transformers 5 always ties T5's lm_head to the shared embedding (T5Config forces "
    "tie_word_embeddings=True), so memgnn's T0_3B has 2,783,959,040 parameters, not the "
    "published 2,849,757,184: one 32128 x 2048 fp32 matrix (263 MB, plus its gradient and "
    "2 AdamW states when trained) fewer; input length S=64 and target T=4 assumed (tweets "
    "padded to the batch's longest; class labels of <= 4 tokens); AdamW for-loop (torch "
    "1.13, Feb 2023); 'GB' read as GiB (TorchTracemalloc reports MiB)"
)
LIT_NOTE = "padded length <= 512 (Alpaca2k's longest): 512 used"
YAML_DEVICES = (
    "the yaml says devices: 2 and the README's Machine column 4xA10G: 2 used, as the yaml "
    "runs (the column is the machine: every LoRA yaml, devices: 1, shows the same peak and "
    "runtime on 1xA10G and 4xA10G)"
)
LORA_ACCUM = "; gradient accumulation {} in the yaml modelled as 1 (LoRA gradients only)"

# fmt: off
ROWS: list[Row] = [
    row(id="vit1", model=VIT, model_args={"num_labels": "10"}, zero_grad="zero",
        batch=64, precision="fp32",
        optimizer="adam", device="a100-80gb", metric="reserved", method="replay",
        source=RASBT + "01_pytorch-vit.py (batch_size=64; logs.md's '32' bullet is stale)",
        notes=VIT_NOTE + ZERO_GRAD_NOTE),
    row(id="vit2", model=VIT, model_args={"num_labels": "10"}, zero_grad="zero",
        batch=64, precision="amp-fp16",
        optimizer="adam", device="a100-80gb", metric="reserved", method="replay",
        source=RASBT + "02_mixed-precision.py (Fabric precision='16-mixed')",
        notes=VIT_NOTE + ZERO_GRAD_NOTE),
    row(id="vit3", model=VIT, model_args={"num_labels": "10"}, zero_grad="zero",
        batch=64, precision="bf16",
        optimizer="adam", device="a100-80gb", metric="reserved", method="replay",
        source=RASBT + "03_bfloat16.py (precision='bf16-true')",
        notes=VIT_NOTE + ZERO_GRAD_NOTE),
    row(id="vit4", model=VIT, model_args={"num_labels": "10"}, zero_grad="zero",
        batch=16, precision="bf16",
        optimizer="adam", device="a100-80gb", metric="reserved", method="replay",
        source=RASBT + "04_lower-batchsize.py (batch_size=16)",
        notes=VIT_NOTE + ZERO_GRAD_NOTE),
    row(id="vit5", model=VIT, model_args={"num_labels": "10"}, batch=4, grad_accum=4,
        precision="bf16", optimizer="adam", device="a100-80gb", metric="reserved",
        method="replay", source=RASBT + "05_gradient-accum.py (micro-batch 4 x 4 steps)",
        notes=VIT_NOTE),
    row(id="vit6", model=VIT, batch=1, precision="fp32", optimizer="adam",
        optimizer_impl="foreach", device="a100-80gb", metric="allocated", unit="GB(1e9)",
        approximate=True, method="replay",
        source="pytorch.org tutorials optimizer_step_in_backward_tutorial (1000-class head)",
        notes=VIT_NOTE.replace("the 10-class head", "the 1000-class head (304,326,632)")
        + "; value read off a memory-snapshot plot (allocated), +-0.5 GB"),
    row(id="vit7", why_not="the optimizer steps inside backward (per-parameter hooks free "
        "each gradient at once): memgnn's step runs backward, then the optimizer"),
    row(id="peft1", model="hf:bigscience/T0_3B", batch=8, seq=64, dims={"T": 4},
        optimizer="adamw", optimizer_impl="for-loop", device="a100-80gb", unit="GiB",
        method="analytic", source="huggingface/peft@5d602fdb README.md + examples/"
        "conditional_generation/peft_lora_seq2seq_accelerate_ds_zero3_offload.py",
        notes=T0_NOTE),
    row(id="peft2", model="hf:bigscience/T0_3B", batch=8, seq=64, dims={"T": 4},
        optimizer="adamw", optimizer_impl="for-loop", device="a100-80gb", unit="GiB",
        method="analytic", **_lora(8, 32.0, 0.1, "q,v"),
        source="huggingface/peft@5d602fdb (LoraConfig r=8, lora_alpha=32, lora_dropout=0.1; "
        "peft's T5 default targets q, v)", notes=T0_NOTE),
    row(id="ttitan1", gpus=8, sharding="fsdp", device="h100-80gb",
        why_not="torchtitan FSDP2 with fp32 sharded master weights and bf16 "
        "compute (MixedPrecisionPolicy) and op-level selective activation checkpointing: "
        "neither is a memgnn option; H100 96 GB has no profile"),
    row(id="ttitan2", gpus=8, sharding="fsdp", device="h100-80gb",
        why_not="as ttitan1, plus torch.compile (fused kernels change which "
        "intermediates exist); memgnn captures eager aten ops"),
    row(id="ttitan3", gpus=128, sharding="fsdp", device="h100-80gb",
        why_not="as ttitan1 on 128 GPUs (FSDP over 128 ranks)"),
    _lit("litgpt1", "hf:tiiuae/falcon-7b", "falcon-7b/lora.yaml", 1, 1,
         **_lora(32, 16.0, 0.05, "query_key_value"),
         notes=LIT_NOTE + "; LoRA q+v of LitGPT's fused qkv -> peft on Falcon's fused "
         "query_key_value" + LORA_ACCUM.format(8)),
    _lit("litgpt2", "hf:tiiuae/falcon-7b", "falcon-7b/qlora.yaml", 1, 1, quantize_base="nf4",
         **_lora(32, 16.0, 0.05, "query_key_value"), notes=LIT_NOTE + LORA_ACCUM.format(8)),
    _lit("litgpt3", "hf:google/gemma-2b", "gemma-2b/lora.yaml", 2, 1,
         **_lora(8, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(3)),
    _lit("litgpt4", "hf:google/gemma-2b", "gemma-2b/qlora.yaml", 2, 1, quantize_base="nf4",
         **_lora(16, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(3)),
    _lit("litgpt5", "hf:google/gemma-7b", "gemma-7b/lora.yaml", 1, 1, metric="device_total",
         **_lora(16, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(6)),
    _lit("litgpt6", "hf:google/gemma-7b", "gemma-7b/qlora.yaml", 1, 1, quantize_base="nf4",
         **_lora(16, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(6)),
    _lit("litgpt7", "hf:google/gemma-2-9b", "gemma2-9b/lora.yaml", 1, 1, metric="device_total",
         **_lora(16, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(6)),
    _lit("litgpt8", "hf:google/gemma-2-9b", "gemma2-9b/qlora.yaml", 1, 1, quantize_base="nf4",
         **_lora(16, 16.0, 0.1, LLAMA_ALL), notes=LIT_NOTE + LORA_ACCUM.format(6)),
    _lit("litgpt9", "hf:meta-llama/Llama-2-7b-hf", "llama-2-7b/lora.yaml", 2, 1,
         **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(4)),
    _lit("litgpt10", "hf:meta-llama/Llama-2-7b-hf", "llama-2-7b/qlora.yaml", 2, 1,
         quantize_base="nf4", **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(4)),
    _lit("litgpt11", "hf:meta-llama/Meta-Llama-3-8B", "llama-3-8b/lora.yaml", 1, 1,
         **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(8)),
    _lit("litgpt12", "hf:meta-llama/Meta-Llama-3-8B", "llama-3-8b/qlora.yaml", 2, 1,
         quantize_base="nf4", **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(4)),
    _lit("litgpt13", "hf:meta-llama/Llama-3.1-8B", "llama-3.1-8b/full.yaml", 4, 16,
         metric="device_total",
         notes=LIT_NOTE + "; the yaml says devices: 4, the README row 1xA10G: 1 GPU, "
         "accumulation 64 / 4 = 16"),
    _lit("litgpt14", "hf:mistralai/Mistral-7B-v0.1", "mistral-7b/lora.yaml", 2, 1,
         **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(4)),
    _lit("litgpt15", "hf:mistralai/Mistral-7B-v0.1", "mistral-7b/qlora.yaml", 2, 1,
         quantize_base="nf4", **_lora(32, 16.0, 0.05, QV), notes=LIT_NOTE + LORA_ACCUM.format(4)),
    _lit("litgpt16", "hf:microsoft/phi-2", "phi-2/lora.yaml", 4, 1,
         **_lora(8, 16.0, 0.05, "q_proj,k_proj,v_proj,dense,fc1,fc2,lm_head"),
         notes=LIT_NOTE + LORA_ACCUM.format(2)),
    _lit("litgpt17", "hf:microsoft/phi-2", "phi-2/qlora.yaml", 4, 1, quantize_base="nf4",
         **_lora(8, 16.0, 0.05, "q_proj,k_proj,v_proj,dense,fc1,fc2,lm_head"),
         notes=LIT_NOTE + LORA_ACCUM.format(2)),
    _lit("litgpt18", "hf:microsoft/Phi-3-mini-4k-instruct", "phi-3/full.yaml", 4, 2, suspect=True,
         notes=LIT_NOTE + "; accumulation 8 / 4 = 2; the CSV flags it: AdamW states alone "
         "for 3.8B bf16 parameters are 15.3 GB, all state 30.6 GB > 17.01 GB and > the "
         "A10G's 24 GB (see the litgpt18 section)"),
    _lit("litgpt19", "hf:microsoft/Phi-3-mini-4k-instruct", "phi-3/lora.yaml", 4, 1,
         **_lora(8, 16.0, 0.05, "qkv_proj,o_proj,gate_up_proj,down_proj,lm_head"),
         notes=LIT_NOTE + "; LoRA on HF's fused qkv_proj / gate_up_proj" + LORA_ACCUM.format(2)),
    _lit("litgpt20", "hf:stabilityai/stablelm-base-alpha-3b", "stablelm-base-alpha-3b/lora.yaml",
         1, 1, **_lora(32, 16.0, 0.05, "query_key_value"),
         notes=LIT_NOTE + "; LoRA q+v -> GPT-NeoX's fused query_key_value"
         + LORA_ACCUM.format(8)),
    _lit("litgpt21", "hf:stabilityai/stablelm-base-alpha-3b",
         "stablelm-base-alpha-3b/qlora.yaml", 1, 1, quantize_base="nf4",
         **_lora(32, 16.0, 0.05, "query_key_value"), notes=LIT_NOTE + LORA_ACCUM.format(8)),
    _lit("litgpt22", "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tiny-llama/full.yaml", 4, 8,
         method="replay",
         notes=LIT_NOTE + "; accumulation 32 / 4 = 8 (gradients live through every "
         "micro-step); LitGPT's checkpoint is TinyLlama-1.1B-intermediate-step-1431k-3T, "
         "the same architecture as the catalog's Chat-v1.0"),
    _lit("litgpt23", "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tiny-llama/lora.yaml", 8, 1,
         **_lora(32, 16.0, 0.05, LLAMA_ALL), notes=LIT_NOTE + "; accumulation 8 / 8 = 1"),
    _lit("litgpt24", "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tiny-llama/qlora.yaml", 8, 1,
         quantize_base="nf4", **_lora(32, 16.0, 0.05, LLAMA_ALL),
         notes=LIT_NOTE + "; accumulation 8 / 8 = 1"),
    _lit("litgpt4x1", "hf:google/gemma-2b", "gemma-2b/full.yaml", 1, 4, gpus=4,
         sharding="fsdp", checkpointing="full",
         notes=LIT_NOTE + "; FSDP FULL_SHARD, every Block checkpointed; accumulation "
         "16 / (1 x 4) = 4"),
    _lit("litgpt4x2", "hf:microsoft/phi-2", "phi-2/full.yaml", 4, 1, gpus=2, sharding="fsdp",
         checkpointing="full",
         notes=LIT_NOTE + "; " + YAML_DEVICES + "; accumulation (8 // 2) // 4 = 1 (on 4 "
         "devices LitGPT's own assert stops it: (8 // 4) // 4 = 0)"),
    _lit("litgpt4x3", "hf:stabilityai/stablelm-base-alpha-3b", "stablelm-base-alpha-3b/full.yaml",
         1, 4, gpus=2, sharding="fsdp", checkpointing="full",
         notes=LIT_NOTE + "; " + YAML_DEVICES + "; accumulation (8 // 2) // 1 = 4"),
    _lit("litgpt4x4", "hf:meta-llama/Llama-2-7b-hf", "llama-2-7b/full.yaml", 4, 4, gpus=4,
         sharding="fsdp", checkpointing="full", metric="device_total",
         notes=LIT_NOTE + "; accumulation 64 / (4 x 4) = 4"),
    _lit("litgpt4x5", "hf:meta-llama/Meta-Llama-3-8B", "llama-3-8b/full.yaml", 4, 4, gpus=4,
         sharding="fsdp", checkpointing="full", metric="device_total",
         notes=LIT_NOTE + "; accumulation 64 / (4 x 4) = 4"),
]
# fmt: on
BY_ID = {r.id: r for r in ROWS}

# ---- public-gpu-measurements-2.csv: FSDP1 and FSDP-QLoRA rows ------------------------------
# Answer.AI fsdp_qlora (github.com/AnswerDotAI/fsdp_qlora @ 05ed9f2, train.py and
# benchmarks_03_2024.md), runs of Feb-Mar 2024: `--train_type qlora|lora`,
# `--use_gradient_checkpointing True --reentrant_checkpointing True --use_cpu_offload False`
# and the defaults of train.py: precision bf16 (model in bf16, no MixedPrecision policy),
# LoRA r 64, alpha 16, dropout 0.1 on k/q/v/up/down/gate_proj (`lora_target_modules="all"`),
# peft's get_peft_model (peft of that date cast the adapters to the base weight's dtype: bf16;
# the bf16-stored 4-bit codes are floating point too), torch AdamW (foreach on CUDA), 4-bit
# base = bnb Linear4bit(quant_type="nf4", quant_storage=bf16) with Linear4bit's default
# compress_statistics=True (double quantisation), lm_head kept bf16, bitsandbytes 0.43.0
# (the first with quant_storage; before 0.43.2, MatMul4Bit kept its input as ctx.tensors,
# but under reentrant checkpointing the forward runs without grad, so no graph node holds
# it: memgnn's default kernels, which keep nothing, are the closer model), FSDP1
# FullyShardedDataParallel(use_orig_params=False, limit_all_gathers=True, sharding_strategy
# full_shard or NO_SHARD for "ddp", auto_wrap_policy = trainable leaves + LlamaDecoderLayer
# (llama-recipes' policy = peft's), default BACKWARD_PRE), checkpoint_wrapper(REENTRANT) per
# decoder layer, sdpa attention, use_cache=False; `torch.cuda.max_memory_reserved` per rank.
AAI = "AnswerDotAI/fsdp_qlora@05ed9f2 train.py + benchmarks_03_2024.md"
AAI_LORA = {
    **_lora(64, 16.0, 0.1, "q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj"),
    "lora_dtype": "model", "precision": "bf16", "checkpointing": "full", "gpus": 2,
    "sharding": "fsdp1", "fsdp1_wrap": "peft",
}  # fmt: skip
AAI_QLORA = AAI_LORA | {"quantize_base": "nf4-dq", "bnb_quant_storage": "bf16"}
AAI_NOTE = (
    "reentrant checkpoint_wrapper modelled as non-reentrant checkpointing of every decoder "
    "layer (bitsandbytes 0.43.0 kept each 4-bit matmul's input with its graph node; under "
    "reentrant checkpointing only while a layer is recomputed, which memgnn does not model: "
    "its default kernels keep none; --bnb-version 0.43.0 with non-reentrant checkpointing "
    "would hold every layer's, +3 GB at 7B, S 2048); transformers 4.38's LlamaForCausalLM "
    "upcast the logits to fp32 (memgnn runs "
    "transformers 5's); caching-allocator pools per stream (FSDP1 all-gathers on its own "
    "stream) are not simulated: the reserved figure is a single-stream replay"
)
# `--use_cpu_offload True`: FSDP(cpu_offload=CPUOffload(offload_params=True)); train.py's
# torch AdamW then steps CPU tensors (PyTorch's for-loop implementation there)
AAI_OFFLOAD_NOTE = (
    "; FSDP1 CPUOffload(offload_params=True): the parameter and gradient shards in pinned "
    "host memory, AdamW stepping on the CPU (host figures in the breakdown, not in the "
    "device figure); the H2D copy of each unit's shard and its device gradient shard "
    "(kept until backward ends) counted on the device"
)
AAI_CPU_OFFLOAD = {"fsdp1_cpu_offload": True}
# "Mistral 7B v0.2 Base" (hub id not stated): Mistral-7B-v0.1's shapes (v0.2 changed
# rope_theta and dropped the sliding window, neither a shape): the window widened past the
# longest row's length (32768, v0.2's context) as v0.2 has none
AAI_MISTRAL = {
    "model": "hf:mistralai/Mistral-7B-v0.1",
    "model_args": {"use_cache": "false", "sliding_window": "32768"},
}
LLAMA2_7B = "hf:meta-llama/Llama-2-7b-hf"


def _aai(id: str, batch: int, seq: int, device: str, quant: bool, strategy: str = "",
         **kw) -> Row:  # fmt: skip
    train = AAI_QLORA if quant else AAI_LORA
    if strategy:
        train = train | {"fsdp1_sharding_strategy": strategy}
    kw.setdefault("model", LLAMA2_7B)
    kw.setdefault("model_args", {"use_cache": "false"})
    notes = AAI_NOTE + (AAI_OFFLOAD_NOTE if kw.get("fsdp1_cpu_offload") else "")
    return row(
        id=id, batch=batch, seq=seq, device=device, metric="reserved",
        unit="GiB", method="replay", source=AAI, notes=notes, **train, **kw,
    )  # fmt: skip


# fmt: off
ROWS2: list[Row] = [
    _aai("aai1", 1, 512, "rtx3090-24gb", True),
    _aai("aai2", 1, 2048, "rtx3090-24gb", True),
    _aai("aai3", 1, 512, "rtx3090-24gb", False),
    _aai("aai4", 1, 2048, "rtx3090-24gb", False),
    _aai("aai5", 4, 2048, "rtx3090-24gb", True),
    _aai("aai6", 10, 2048, "rtx3090-24gb", True),
    _aai("aai7", 4, 2048, "rtx3090-24gb", False),
    _aai("aai8", 6, 2048, "rtx3090-24gb", False),
    _aai("aai9", 8, 2048, "rtx3090-24gb", True, "NO_SHARD"),
    _aai("aai10", 4, 2048, "rtx3090-24gb", False, "NO_SHARD"),
    row(id="aai11", why_not="01-ai/Yi-34B is not in memgnn's offline catalog"),
    row(id="aai12", why_not="01-ai/Yi-34B is not in memgnn's offline catalog"),
    _aai("aai13", 2, 2048, "rtx3090-24gb", True, model="hf:meta-llama/Llama-2-70b-hf",
         **AAI_CPU_OFFLOAD),
    _aai("aai14", 4, 2048, "rtx4090-24gb", False, "NO_SHARD"),
    _aai("aai15", 6, 2048, "rtx4090-24gb", False),
    _aai("aai16", 10, 2048, "rtx4090-24gb", False, **AAI_CPU_OFFLOAD),
    _aai("aai17", 8, 2048, "rtx4090-24gb", True, "NO_SHARD"),
    _aai("aai18", 10, 2048, "rtx4090-24gb", True),
    _aai("aai19", 12, 2048, "rtx4090-24gb", True, **AAI_CPU_OFFLOAD),
    _aai("aai20", 12, 2048, "rtx4090-24gb", True, **AAI_MISTRAL, **AAI_CPU_OFFLOAD),
    _aai("aai21", 1, 24576, "rtx4090-24gb", True, **AAI_MISTRAL, **AAI_CPU_OFFLOAD),
    # torchtune's distributed recipes of May 2024 (FSDP1): its own Llama-2 code (memgnn
    # captures HF's, the same shapes), bf16 model, LoRA q/v r 8 alpha 16 in the model's
    # dtype, lora_fsdp_wrap_policy (adapters + decoder layers), activation checkpointing;
    # the README's "peak memory per GPU" does not say which statistic: read as reserved
    row(id="ttune21", model=LLAMA2_7B, batch=4, seq=2048, device="rtx4090-24gb",
        metric="reserved", unit="GiB", method="replay", approximate=True,
        source="pytorch/torchtune@0217d44c2 README.md + recipes/configs/llama2/7B_lora.yaml",
        notes="torchtune's model code and log statistic; unit GB read as GiB; seq is the "
        "config's max_seq_len (alpaca samples are padded to the batch's longest)",
        **_lora(8, 16.0, 0.0, "q_proj,v_proj"), lora_dtype="model", precision="bf16",
        checkpointing="full", gpus=2, sharding="fsdp1", fsdp1_wrap="peft"),
    row(id="ttune23", why_not="bitsandbytes PagedAdamW: paged optimizers are not modelled yet"),
    row(id="ttune24", model="hf:meta-llama/Llama-2-70b-hf", batch=4, seq=4096,
        device="a100-80gb", metric="reserved", unit="GiB", method="replay", approximate=True,
        source="pytorch/torchtune@0217d44c2 README.md + recipes/configs/llama2/70B_lora.yaml",
        suspect=True,
        notes="as ttune21, 8 A100s. The figure contradicts B x S = 4 x 4096 by hand: rank 0 "
        "holds 69.0e9 x 2 B / 8 = 16.1 GiB of bf16 weights, and the 80 checkpointed layer "
        "inputs alone are 80 x 4 x 4096 x 8192 x 2 B = 20 GiB, 36 GiB > 26.4; the recipe "
        "pads alpaca samples to the batch's longest, not to max_seq_len 4096",
        **_lora(8, 16.0, 0.0, "q_proj,v_proj"), lora_dtype="model", precision="bf16",
        checkpointing="full", gpus=8, sharding="fsdp1", fsdp1_wrap="peft"),
    row(id="ttune25", why_not="bitsandbytes PagedAdamW: paged optimizers are not modelled yet"),
]
# fmt: on
BY_ID2 = {r.id: r for r in ROWS2}

# Not CSV rows: the same config with one setting changed, to show what that setting is worth.
PROBES: dict[str, tuple[str, Row]] = {
    "litgpt22-G1": (
        "litgpt22",
        _lit(
            "litgpt22-G1",
            "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0",
            "tiny-llama/full.yaml",
            4,
            1,
            method="replay",
            notes="litgpt22 without gradient accumulation (the earlier reading of the row)",
        ),
    ),
}
