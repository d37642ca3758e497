"""Validate the `sim` backend against the real GPU: a fixed matrix of training configs, each
profiled with `backend="cuda"` and with `backend="sim"` on the detected device profile.

Pairs go to `OUT/validate_gpu_records.jsonl` (one JSON line per config, appended and flushed
as each finishes; a rerun skips configs whose job id is already there, so an interrupted run
resumes). Then `OUT/validate_gpu_summary.json` and `.md`: per metric (allocated, reserved,
device_total), the relative error (sim - real) / real over the configs that ran on both
sides without error or OOM, and the worst configs.

    memgnn validate-gpu --out runs/validate [--limit N] [--device h200-141gb]
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.spec.bundle import check_size
from memgnn.predictor.spec.devices import PROFILES, DeviceProfile, get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import get_family, make_bundle

log = logging.getLogger(__name__)

RECORDS_FILE = "validate_gpu_records.jsonl"
SUMMARY_JSON = "validate_gpu_summary.json"
SUMMARY_MD = "validate_gpu_summary.md"
METRICS = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "device_total": "device_total_bytes",
}
WORST = 5

# (zoo name, hparam overrides, two sizes, configs drawn for it). Tiny-to-medium models,
# batch x seq up to 16k tokens: each config runs in well under a second on an H200; the
# sim side (a fake-tensor capture on the CPU) dominates the run time.
_MODELS: tuple[tuple[str, dict[str, Any], tuple[dict[str, int], ...], int], ...] = (
    ("gpt2", dict(layers=4, hidden=256, heads=4, vocab=8192, dropout=0.0),
     ({"B": 8, "S": 256}, {"B": 16, "S": 1024}), 6),
    ("llama", dict(layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=8192),
     ({"B": 8, "S": 256}, {"B": 16, "S": 1024}), 6),
    ("bert", dict(layers=4, hidden=256, heads=4, ffn=1024, vocab=8192, dropout=0.1),
     ({"B": 16, "S": 128}, {"B": 32, "S": 512}), 6),
    ("vit", dict(layers=4, hidden=192, heads=4, ffn=768, image=64, patch=8, classes=100),
     ({"B": 32}, {"B": 128}), 6),
    ("mlp", dict(features=784, hidden=1024, layers=4, classes=100, activation="gelu"),
     ({"B": 1024}, {"B": 16384}), 6),
    ("resnet", dict(stages=3, blocks=2, width=32, image=64, classes=100),
     ({"B": 32}, {"B": 128}), 6),
    ("lstm", dict(vocab=4096, hidden=256, layers=2, impl="scan"),
     ({"B": 16, "S": 64}, {"B": 32, "S": 128}), 3),
    ("lstm", dict(vocab=4096, hidden=256, layers=2, impl="native"),
     ({"B": 16, "S": 64}, {"B": 32, "S": 128}), 3),
)  # fmt: skip

# Training variants: every precision, optimizer (and implementation), checkpointing and
# accumulation choice appears; model k, config i takes variant (i + 3k) mod 8.
_TRAINS: tuple[dict[str, Any], ...] = (
    dict(precision="fp32", optimizer="adamw", optimizer_impl="foreach"),
    dict(precision="amp-bf16", optimizer="adamw", optimizer_impl="fused"),
    dict(precision="bf16", optimizer="sgd"),
    dict(precision="amp-fp16", optimizer="adamw", optimizer_impl="foreach", grad_accum=2),
    dict(precision="amp-bf16", optimizer="adafactor", checkpointing="full"),
    dict(precision="fp32", optimizer="sgd", checkpointing="full", grad_accum=2),
    dict(precision="bf16", optimizer="adamw", optimizer_impl="fused", checkpointing="full"),
    dict(precision="amp-fp16", optimizer="adafactor", grad_accum=2),
)


@dataclass(kw_only=True, slots=True)
class ValidationConfig:
    """One matrix entry: a zoo model with hparam overrides, input sizes and a TrainSpec."""

    model: str
    hparams: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    family: str = ""  # filled from the zoo

    def __post_init__(self) -> None:
        fam = get_family(self.model)  # ValueError for an unknown zoo name
        fam.hparams(self.hparams)  # ValueError for an unknown hparam
        self.family = fam.family
        for sym, value in self.sizes.items():
            if sym not in fam.dims:
                raise ValueError(f"{self.model}: {sym!r} is not an input dim ({list(fam.dims)})")
            check_size(sym, value)
        try:
            self.train = TrainSpec.of(**self.train).flat()  # explicit defaults: stable ids
        except TypeError as exc:
            raise ValueError(f"bad train options {self.train}: {exc}") from None

    def train_spec(self) -> TrainSpec:
        return TrainSpec.of(**self.train)

    def canonical(self) -> dict[str, Any]:
        return {"model": self.model, "hparams": self.hparams, "sizes": self.sizes,
                "train": self.train}  # fmt: skip

    @property
    def job_id(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()

    def label(self) -> str:
        t = self.train
        extras = [t["optimizer_impl"]] if t["optimizer_impl"] != "auto" else []
        if t["checkpointing"] != "none":
            extras.append(f"ckpt={t['checkpointing']}")
        if t["grad_accum"] > 1:
            extras.append(f"accum={t['grad_accum']}")
        sizes = ",".join(f"{k}={v}" for k, v in self.sizes.items())
        return f"{self.model}[{sizes}] {t['precision']} {t['optimizer']} {' '.join(extras)}".strip()


def config_matrix() -> list[ValidationConfig]:
    """The fixed validation matrix (deterministic; unique job ids)."""
    out: list[ValidationConfig] = []
    for k, (model, hparams, sizes, count) in enumerate(_MODELS):
        for i in range(count):
            train = _TRAINS[(i + 3 * k) % len(_TRAINS)]
            out.append(
                ValidationConfig(
                    model=model, hparams=dict(hparams), sizes=dict(sizes[i % 2]), train=dict(train)
                )
            )
    return out


# ---- running -----------------------------------------------------------------------------


def load_pairs(path: Path) -> list[dict[str, Any]]:
    """The pairs in a records file; a line cut short by a crash is skipped."""
    if not path.exists():
        return []
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            pairs.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s:%d is not JSON (an interrupted write?); skipped", path, n)
    return pairs


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def run_pair(
    cfg: ValidationConfig, cuda_config: ProfileConfig, sim_config: ProfileConfig
) -> dict[str, Any]:
    """Profile one config on both backends; a side that raises keeps its error."""
    pair: dict[str, Any] = {"job_id": cfg.job_id, "config": cfg.canonical(), "family": cfg.family}
    errors: dict[str, str] = {}
    t0 = time.perf_counter()
    try:
        bundle = make_bundle(cfg.model, cfg.hparams)
    except Exception as exc:  # a bad model must not stop the matrix
        errors["config"] = f"{type(exc).__name__}: {exc}"
        bundle = None
    for side, pcfg in (("cuda", cuda_config), ("sim", sim_config)):
        pair[side] = None
        if bundle is None:
            continue
        try:
            record = profile(bundle, cfg.train_spec(), dict(cfg.sizes), pcfg)
            pair[side] = record.model_dump(mode="json")
        except Exception as exc:  # recorded, and the matrix goes on
            log.warning("%s: %s side failed: %s", cfg.label(), side, exc)
            errors[side] = f"{type(exc).__name__}: {exc}"
    pair["errors"] = errors
    pair["seconds"] = round(time.perf_counter() - t0, 3)
    return pair


def _progress(items: Sequence[Any], enabled: bool) -> Iterable[Any]:
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="validate-gpu", unit="config")


def run_validation(
    out_dir: Path,
    *,
    limit: int | None = None,
    device_name: str | None = None,
    configs: Sequence[ValidationConfig] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Profile the matrix (or `configs`) on cuda and sim, resuming from `out_dir`; write and
    return the summary. `device_name`: the device profile (default: detected)."""
    from memgnn.dataset.cuda_backend import detect_profile, nearest_known

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    device: DeviceProfile = get_profile(device_name) if device_name else detect_profile()
    known = device.name in PROFILES
    sim_device = device if known else nearest_known(device)
    if not known:
        log.warning("device %s has no profile; the sim uses %s", device.name, sim_device.name)
    cuda_config = ProfileConfig(backend="cuda", device=device.name if known else None)
    sim_config = ProfileConfig(backend="sim", device=sim_device.name)

    todo = list(configs if configs is not None else config_matrix())[:limit]
    out_dir.mkdir(parents=True, exist_ok=True)
    records = out_dir / RECORDS_FILE
    done = {p.get("job_id") for p in load_pairs(records)}
    pending = [c for c in todo if c.job_id not in done]
    log.info(
        "%d configs: %d done before, %d to run", len(todo), len(todo) - len(pending), len(pending)
    )
    with records.open("a") as fh:
        if records.stat().st_size and not records.read_bytes().endswith(b"\n"):
            fh.write("\n")  # close a line an interrupted run left open
        for n, cfg in enumerate(_progress(pending, progress), 1):
            pair = run_pair(cfg, cuda_config, sim_config)
            fh.write(json.dumps(pair, default=_json_default) + "\n")
            fh.flush()
            log.info("[%d/%d] %s: %s", n, len(pending), cfg.label(), _pair_line(pair))
    wanted = {c.job_id for c in todo}
    summary = summarize([p for p in load_pairs(records) if p.get("job_id") in wanted])
    summary.update(device=device.name, sim_device=sim_device.name, torch_version=torch.__version__)
    (out_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2, default=_json_default))
    (out_dir / SUMMARY_MD).write_text(render_markdown(summary))
    return summary


def _pair_line(pair: dict[str, Any]) -> str:
    if pair.get("errors"):
        return "errors: " + "; ".join(f"{k}: {v}" for k, v in pair["errors"].items())
    rel = relative_error(pair, METRICS["reserved"])
    if rel is None:
        return "no comparison (OOM or missing value)"
    return f"reserved real {pair['cuda']['peak_reserved_bytes']:,} sim {rel:+.1%}"


# ---- summary -----------------------------------------------------------------------------


def relative_error(pair: dict[str, Any], key: str) -> float | None:
    """(sim - real) / real for one metric, or None where it cannot be compared (an error,
    an OOM on the GPU, a missing or zero value)."""
    real, sim = pair.get("cuda"), pair.get("sim")
    if pair.get("errors") or not real or not sim or real.get("error") or sim.get("error"):
        return None
    if (real.get("stats") or {}).get("oom"):
        return None
    actual, predicted = real.get(key), sim.get(key)
    if actual is None or predicted is None or actual <= 0:
        return None
    return (predicted - actual) / actual


def summarize(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: n, median / p90 / max of |relative error|, signed median and mean (bias),
    and the WORST configs by |relative error|."""
    oom = sum(1 for p in pairs if ((p.get("cuda") or {}).get("stats") or {}).get("oom"))
    out: dict[str, Any] = {
        "pairs": len(pairs),
        "failed": sum(1 for p in pairs if p.get("errors")),
        "cuda_oom": oom,
        "metrics": {},
    }
    for metric, key in METRICS.items():
        rows = [(rel, p) for p in pairs if (rel := relative_error(p, key)) is not None]
        signed = np.array([r for r, _ in rows], dtype=float)
        err = np.abs(signed)
        by_family: dict[str, list[float]] = {}
        for rel, p in rows:
            by_family.setdefault(p.get("family", "?"), []).append(abs(rel))
        worst = sorted(rows, key=lambda row: -abs(row[0]))[:WORST]
        out["metrics"][metric] = {
            "n": len(rows),
            "median_abs": float(np.median(err)) if len(rows) else None,
            "p90_abs": float(np.percentile(err, 90)) if len(rows) else None,
            "max_abs": float(err.max()) if len(rows) else None,
            "median_signed": float(np.median(signed)) if len(rows) else None,
            "mean_signed": float(signed.mean()) if len(rows) else None,
            "by_family_median_abs": {f: float(np.median(v)) for f, v in sorted(by_family.items())},
            "worst": [
                {
                    "job_id": p["job_id"],
                    "config": p.get("config"),
                    "real": p["cuda"][key],
                    "sim": p["sim"][key],
                    "rel_error": rel,
                }
                for rel, p in worst
            ],
        }
    return out


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _describe(config: dict[str, Any] | None) -> str:
    if not config:
        return "?"
    try:
        return ValidationConfig(**config).label()
    except (TypeError, ValueError):
        return json.dumps(config, sort_keys=True)


def render_markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown report (one table of metrics, then the worst configs)."""
    lines = [
        "# sim vs cuda: GPU validation",
        "",
        f"Device: {summary.get('device', '?')} (sim profile {summary.get('sim_device', '?')}), "
        f"torch {summary.get('torch_version', '?')}. Pairs: {summary.get('pairs', 0)}, "
        f"failed: {summary.get('failed', 0)}, OOM on the GPU: {summary.get('cuda_oom', 0)}.",
        "",
        "Relative error = (sim - real) / real.",
        "",
        "| metric | n | median abs | p90 abs | max abs | median signed | mean signed |",
        "|---|---|---|---|---|---|---|",
    ]
    metrics = summary.get("metrics", {})
    for metric, m in metrics.items():
        lines.append(
            f"| {metric} | {m['n']} | {_pct(m['median_abs'])} | {_pct(m['p90_abs'])} | "
            f"{_pct(m['max_abs'])} | {_pct(m['median_signed'], True)} | "
            f"{_pct(m['mean_signed'], True)} |"
        )
    for metric, m in metrics.items():
        lines += ["", f"## Worst configs: {metric}", ""]
        if not m["worst"]:
            lines.append("(none compared)")
            continue
        lines += ["| config | real bytes | sim bytes | error |", "|---|---|---|---|"]
        for w in m["worst"]:
            lines.append(
                f"| {_describe(w['config'])} | {w['real']:,} | {w['sim']:,} | "
                f"{_pct(w['rel_error'], True)} |"
            )
        if m["by_family_median_abs"]:
            fams = ", ".join(f"{f} {_pct(v)}" for f, v in m["by_family_median_abs"].items())
            lines += ["", f"Median abs error by family: {fams}."]
    return "\n".join(lines) + "\n"
