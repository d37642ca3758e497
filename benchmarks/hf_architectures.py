"""Which architectures the installed transformers ships does memgnn capture symbolically?

Every model type with a causal-LM, masked-LM, seq2seq-LM or sequence-classification class
(first of those it has) gets a tiny config built offline (`AutoConfig.for_model` with 2 layers,
hidden 64, 4 heads, vocab 256, 4 experts where it has experts), written as config.json
and captured as a user's `hf:PATH` would be: `resolve` then a symbolic capture (cpu
target, AdamW, first step). Each architecture has a time bound; a worker process runs
them one by one, so a crash or a hang costs one architecture, not the sweep.

    .venv/bin/python benchmarks/hf_architectures.py [--workers 2] [--timeout 90] [--only a,b]
        -> benchmarks/results/hf_architectures.{json,md}
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_io import RESULTS, write_results

TASK_MAPS = (  # task -> transformers' name table for it, in the order tried
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),  # T5 kin: trained so
    ("seq-cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
)
TINY: dict[str, Any] = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"), 2
    ),
    **dict.fromkeys(("encoder_layers", "num_decoder_layers"), 2),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim"), 64),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "d_ff"), 128),
    **dict.fromkeys(("encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size"), 128),
    **dict.fromkeys(("shared_expert_intermediate_size",), 128),
    "head_dim": 16,
    "rotary_dim": 16,
    "vocab_size": 256,
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 128),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk"), 2),
}
EXTRA = {  # per-layer lists and layouts that 2 layers must still cover
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "bamba": {"attn_layer_indices": [1]},  # default: None, every layer a mamba mixer
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},  # default: 1 in 8, at 4
    # default: every layer a mamba mixer (Granite 4.0's hybrids put attention in some)
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "zamba2": {"hybrid_layer_ids": [1]},  # the layer its kind list makes hybrid
    # num_heads x head_dim = expand x hidden; the groups divide the heads (default 8 > 4)
    "mamba2": {"head_dim": 32, "n_groups": 2},
    "zaya": {"num_experts_per_tok": 1},  # the only routing it supports
    "esmc": {"num_key_value_heads": 4},  # no grouped-query attention
    "t5": {"decoder_start_token_id": 0},  # every T5 checkpoint's config.json has it
    "mobilebert": {"embedding_size": 32, "intra_bottleneck_size": 32},  # below hidden 64
    "squeezebert": {"embedding_size": 64},  # = hidden (else a Conv1d it does not have)
    "funnel": {"block_sizes": [1, 1], "block_repeats": [1, 1]},  # its layers, per block
    "prophetnet": {
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "encoder_ffn_dim": 128,
        "num_encoder_attention_heads": 4,
        "num_decoder_attention_heads": 4,
    },  # fmt: skip
    "esm": {"pad_token_id": 1, "mask_token_id": 2},  # default: None, its mask needs one
    # fields the model reads that its config class leaves unset (every released checkpoint's
    # config.json sets them: dbrx-instruct's attn_config rope_theta 500000 and clip_qkv 8
    # (None clamps with neither bound, which torch refuses), dots.llm1's n_shared_experts 2,
    # LFM2-8B-A1B's layer_types and 2 dense layers of 24)
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 500000.0, "clip_qkv": 8},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "dots1": {"n_shared_experts": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # the full-attention layers' head_dim (default 512: 8 x the tiny hidden size) and the
    # per-layer input embedding (default 262144 x 256 per layer: 134M parameters at 2 layers)
    **dict.fromkeys(
        ("gemma4_text", "gemma4_unified_text"),
        {
            "global_head_dim": 32,
            "vocab_size_per_layer_input": 256,
            "hidden_size_per_layer_input": 16,
        },
    ),
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [32, 32]},  # LM head needs both
    # the shared attention block is tied across the hybrid layers: with one hybrid layer
    # there is nothing to tie it to, which transformers refuses (the default 76-layer layout has 13)
    "zamba": {
        "num_hidden_layers": 3,
        "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
    },
    # the adapters' language (else `set_default_language` or lang_ids per batch)
    "xmod": {"default_language": "en_XX"},
}
# multi-head latent attention (DeepSeek V2/V3 and their kin): latent ranks and head dims
# of its own, consistent at hidden 64 (its rotary `head_dim` is the rope part, every
# query head has its own latent key/value head), expert groups that 4 experts divide into
MLA = {
    "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "n_group": 2, "topk_group": 1,
}  # fmt: skip
# TINY keys a config refuses (its layers are set otherwise; xlnet's position limit raises)
DROP = {
    "funnel": ("num_hidden_layers",),
    "prophetnet": ("num_hidden_layers",),
    "xlnet": ("max_position_embeddings",),
}
# per-layer kind lists: the tiny model keeps one layer of each kind the default has (a
# hybrid cut to its first two layers would hold linear attention only, which the model's
# own cache rejects), in the order the default first uses them
KIND_LISTS = ("layer_types", "layers_block_type", "mlp_layer_types", "block_types")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


# swept first (a sweep cut short by its time budget still covers what users train most)
COMMON = (
    "gpt2 llama mistral qwen2 qwen3 gemma gemma2 phi phi3 opt gpt_neox bloom falcon bert "
    "roberta deberta-v2 distilbert electra xlm-roberta mpt gptj gpt_bigcode starcoder2 mixtral "
    "qwen2_moe qwen3_moe olmo olmo2 cohere stablelm gpt_neo codegen granite deepseek_v3"
).split()


def architectures() -> list[tuple[str, str]]:
    """(model type, task) for every model type with one of the swept tasks, common first."""
    from transformers.models.auto import modeling_auto

    out: dict[str, str] = {}
    for task, table in TASK_MAPS:
        for model_type in getattr(modeling_auto, table):
            out.setdefault(model_type, task)
    rank = {m: k for k, m in enumerate(COMMON)}
    return sorted(out.items(), key=lambda a: (rank.get(a[0], len(rank)), a[0]))


def tiny_config(model_type: str) -> Any:
    import transformers

    default = transformers.AutoConfig.for_model(model_type)
    if getattr(default, "is_heterogeneous", False):
        # per-layer overrides (Gemma 4's full-attention layers' own head_dim): the shrink
        # reads and sets the global values; the overrides are the type's (EXTRA sizes them)
        default.allow_global_per_layer_attribute_access = True
    drop = DROP.get(model_type, ())
    kwargs = {k: v for k, v in TINY.items() if k not in drop and hasattr(default, k)}
    kwargs |= EXTRA.get(model_type, {})
    if hasattr(default, "kv_lora_rank"):
        kwargs |= {k: v for k, v in MLA.items() if hasattr(default, k)}
    layers = kwargs.get("num_hidden_layers")
    for key in KIND_LISTS:
        kinds = vars(default).get(key)  # stored lists only (some are derived properties)
        if key in EXTRA.get(model_type, {}):  # a layout of the type's own
            continue
        if isinstance(layers, int) and isinstance(kinds, list) and kinds:
            distinct = list(dict.fromkeys(map(str, kinds)))
            if len(distinct) > 1 and all(isinstance(k, str) for k in kinds):
                layers = max(layers, len(distinct))
                kwargs[key] = (distinct + kinds)[:layers]
    if isinstance(layers, int) and layers != kwargs.get("num_hidden_layers", layers):
        kwargs["num_hidden_layers"] = layers
        for key in KIND_LISTS:  # every list as long as the layers
            if key in kwargs and len(kwargs[key]) < layers:
                kwargs[key] = (kwargs[key] + list(getattr(default, key)))[:layers]
    for key in TOKEN_IDS:
        value = getattr(default, key, None)
        if isinstance(value, int) and value >= TINY["vocab_size"]:
            kwargs[key] = 1
    for _ in range(3):  # a key the config cannot take (a read-only property): without it
        try:
            config = transformers.AutoConfig.for_model(model_type, **kwargs)
            break
        except (AttributeError, TypeError, ValueError) as exc:
            bad = [k for k in kwargs if f"'{k}'" in str(exc)]
            if not bad:
                raise
            kwargs.pop(bad[0])
    else:
        config = transformers.AutoConfig.for_model(model_type, **kwargs)
    layers = getattr(config, "num_hidden_layers", None)
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and isinstance(layers, int) and len(types) != layers:
        config = transformers.AutoConfig.for_model(model_type, **kwargs, layer_types=types[:layers])
    return config


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run_one(model_type: str, task: str, folder: Path, timeout: int) -> dict[str, Any]:
    """Build the tiny config, resolve it as hf:PATH and capture it symbolically."""
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import resolve

    row: dict[str, Any] = {"model_type": model_type, "task": task, "stage": "config"}
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        path = folder / model_type
        tiny_config(model_type).save_pretrained(str(path))
        row["stage"] = "resolve"
        bundle = resolve(f"hf:{path}", task=task)
        row["stage"] = "capture"
        graph = capture(bundle, TrainSpec.of(steps="first"), CaptureConfig(target="cpu"))
        info = graph.meta["model_info"]
        row |= {
            "status": "ok",
            "stage": "done",
            "class": info["module_class"],
            "attention": info["attention"],
            "parameters": info["parameters"],
            "nodes": sum(p.num_nodes for p in graph.paths),
            "paths": len(graph.paths),
            "guards": len(graph.guards),
        }
    except _Timeout:
        row |= {"status": "timeout", "error": f"over the {timeout} s bound"}
    except Exception as exc:  # the sweep records every failure with its reason
        text = str(exc).strip().splitlines()
        row |= {"status": "fail", "error": f"{type(exc).__name__}: {text[0] if text else ''}"}
    finally:
        signal.alarm(0)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def worker(names: list[str], timeout: int) -> None:
    """Run architectures (model_type:task) one by one, one JSON line each on stdout."""
    logging.disable(logging.WARNING)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)  # one core per worker
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model_type, task = name.split(":")
            print(json.dumps({"start": model_type}), flush=True)
            print(json.dumps(run_one(model_type, task, Path(tmp), timeout)), flush=True)


def _run_shard(todo: list[tuple[str, str]], timeout: int) -> subprocess.Popen:
    names = [f"{m}:{t}" for m, t in todo]
    cmd = [sys.executable, __file__, "--worker", "--timeout", str(timeout), *names]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def sweep(
    archs: list[tuple[str, str]], workers: int, timeout: int, on_row: Any = None
) -> list[dict[str, Any]]:
    """Shards over worker processes; a worker that dies loses its current architecture
    (recorded as crashed) and a new one takes the rest of its shard."""
    rows: dict[str, dict[str, Any]] = {}
    shards = [archs[k::workers] for k in range(workers)]
    tasks = dict(archs)
    while any(shards):
        procs = [(_run_shard(s, timeout), s) for s in shards if s]
        shards = []
        for proc, shard in procs:
            current = None
            assert proc.stdout is not None
            for line in proc.stdout:
                msg = json.loads(line)
                if "start" in msg:
                    current = msg["start"]
                    continue
                rows[msg["model_type"]] = msg
                if on_row is not None:
                    on_row(list(rows.values()))
                print(
                    f"{msg['model_type']:32s} {msg['status']:8s} {msg['seconds']:6.1f}s "
                    f"{msg.get('error', '')[:100]}",
                    flush=True,
                )
                current = None
            code = proc.wait()
            if current is not None:  # died inside one architecture
                rows[current] = {
                    "model_type": current,
                    "task": tasks[current],
                    "status": "crash",
                    "error": f"worker exit code {code}",
                    "stage": "capture",
                    "seconds": None,
                }
                print(f"{current:32s} crash    exit {code}", flush=True)
            shards.append([a for a in shard if a[0] not in rows])
    return [rows[m] for m, _ in archs]


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    lines = [
        "# transformers architectures: symbolic capture",
        "",
        f"`python benchmarks/hf_architectures.py --workers {meta['workers']} --timeout "
        f"{meta['timeout']}`: transformers {meta['transformers']}, torch {meta['torch']}; "
        f"{len(rows)} of {meta['architectures']} architectures "
        f"{'' if meta['complete'] else '(sweep interrupted) '}"
        "(tiny configs, cpu target, AdamW, first step); "
        f"{len(ok)} capture symbolically, {len(rows) - len(ok)} do not; "
        f"{meta['seconds']:.0f} s wall."
        + (
            f" Rerun or added with `--only` (after fixes to the sweep's config shrinking): "
            f"{', '.join(meta['reran'])}."
            if meta.get("reran")
            else ""
        ),
        "",
        "| model type | task | status | class | attention | parameters | nodes | seconds "
        "| why not |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["status"] != "ok", r["model_type"])):
        why = "" if r["status"] == "ok" else f"{r['stage']}: {r.get('error', '')}"
        lines.append(
            f"| {r['model_type']} | {r['task']} | {r['status']} | {r.get('class', '')} | "
            f"{r.get('attention') or ''} | {r.get('parameters', '')} | {r.get('nodes', '')} | "
            f"{r.get('seconds') or ''} | "
            f"{why.replace('|', '/')[:160]} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=90, help="seconds per architecture")
    parser.add_argument("--only", default=None, help="comma list of model types")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.names, args.timeout)
        return 0
    import torch
    import transformers

    archs = architectures()
    if args.only:
        wanted = set(args.only.split(","))
        archs = [a for a in archs if a[0] in wanted]
    t0 = time.perf_counter()
    name = "hf_architectures"
    RESULTS.mkdir(exist_ok=True)
    earlier: dict[str, Any] = {}
    if args.only:  # rerun some: their rows replace the ones of the last full sweep
        earlier = json.loads((RESULTS / f"{name}.json").read_text())

    def write(rows: list[dict[str, Any]], done: bool = False) -> None:
        if earlier:
            new = {r["model_type"]: r for r in rows}
            seen = {r["model_type"] for r in earlier["rows"]}
            rows = [new.get(r["model_type"], r) for r in earlier["rows"]]
            rows += [r for m, r in new.items() if m not in seen]
            reran = sorted(new)
            meta = earlier["meta"] | {
                "reran": sorted(set(earlier["meta"].get("reran", [])) | set(reran)),
                "reran_seconds": time.perf_counter() - t0,
            }
            write_results(name, {"meta": meta, "rows": rows}, _markdown(rows, meta), indent=1)
            return
        meta = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "workers": args.workers,
            "timeout": args.timeout,
            "seconds": time.perf_counter() - t0,
            "complete": done,
            "architectures": len(archs),
        }
        write_results(name, {"meta": meta, "rows": rows}, _markdown(rows, meta), indent=1)

    write(sweep(archs, args.workers, args.timeout, on_row=write), done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
