"""Human-readable output for the CLI: bytes are ints everywhere else, units only here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memgnn.predictor.spec.choices import PRECISION_WORDS
from memgnn.predictor.spec.train import TrainSpec


def fmt_bytes(n: int | None) -> str:
    """1536 -> '1.50 KiB'; None -> '-'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """'24GiB', '24 GB', '1.5e9', '80%'-free: bytes as int; ValueError names bad input."""
    units = {
        "": 1,
        "b": 1,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "tib": 1 << 40,
    }
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"cannot read a byte size from {text!r}") from None
    if unit not in units:
        raise ValueError(f"unknown byte unit {unit!r} in {text!r}")
    if value <= 0:
        raise ValueError(f"byte size must be positive, got {text!r}")
    return int(value * units[unit])


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def fmt_count(n: int) -> str:
    """124439808 -> '124.4 M'; 6738415616 -> '6.74 B'."""
    for div, unit, digits in ((10**9, "B", 2), (10**6, "M", 1), (10**3, "K", 1)):
        if abs(n) >= div:
            return f"{n / div:.{digits}f} {unit}"
    return str(n)


def model_line(info: Mapping[str, Any]) -> str:
    """One line naming the model an answer is about: spec, class, size and dtypes."""
    parts = [str(info["module_class"])]
    if info.get("layers"):
        parts.append(f"{info['layers']} layers")
    elif info.get("blocks"):
        parts.append(f"{info['blocks']} blocks")
    if info.get("hidden"):
        parts.append(f"hidden {info['hidden']}")
    if info.get("attention"):
        parts.append(f"{info['attention']} attention")
    n = int(info["parameters"])
    parts.append(f"{fmt_count(n)} parameters ({n:,})")
    if info.get("trainable_parameters", n) != n:
        parts.append(f"{fmt_count(int(info['trainable_parameters']))} trainable")
    if info.get("adapted"):
        names = ", ".join(f"{k} x{v}" for k, v in info["adapted"].items())
        parts.append(f"adapted: {names}")
    dtype = info.get("param_dtype", "?")
    compute = info.get("compute_dtype", dtype)
    if compute != dtype:
        parts.append(f"params {dtype} (master weights), compute {compute} ({info['precision']})")
    else:
        parts.append(f"params {dtype} ({info['precision']})")
    how = info.get("capture") or {}
    if how.get("mode") == "blocks":
        parts.append(
            f"captured with repeated blocks ({how['blocks']} replicated from a "
            f"{how['captured_blocks']}-block capture)"
        )
    kind = {"zoo": " (zoo config: small by default, size it with --model-arg)"}
    line = f"model {info['spec']}{kind.get(info.get('kind', ''), '')}: {', '.join(parts)}"
    words = PRECISION_WORDS.get(str(info.get("precision")))
    return f"{line}\nprecision {info['precision']}: {words}" if words else line


def loop_line(train: TrainSpec) -> str:
    """What the answer assumed of the training loop around the step."""
    if train.loop.hold_outputs:
        return "loop: keeps each step's outputs and loss until the next forward (--hold-outputs)"
    return (
        "loop: outputs freed with the forward, the loss after backward (HF Trainer); "
        "--hold-outputs if yours keeps them (`outputs = model(**batch)`)"
    )


def compile_lines(train: TrainSpec) -> list[str]:
    """What the answer assumed of `--compile` and `--loss` (nothing when the step is eager
    with the model's own loss)."""
    from memgnn.predictor.emulate import loss
    from memgnn.predictor.emulate.compile import assumption

    texts = [
        assumption(train.kernels.compile, train.parallel.sharding, train.kernels.compile_dynamic),
        loss.assumption(
            train.kernels.loss, train.kernels.compile != "none", train.kernels.compile_loss
        ),
    ]
    return [t for t in texts if t is not None]


def verdict_line(verdict: dict[str, Any], what: str) -> str:
    """`fits: ...` / `does NOT fit: ...` for a `MemoryLimit.verdict`."""
    if verdict["source"] in ("threshold", "default"):
        of = f"{verdict['threshold'] * 100:g}% of the device's {fmt_bytes(verdict['budget_bytes'])}"
        if verdict["source"] == "default":
            of += "; --budget or --threshold to change"
    elif verdict["threshold"] < 1:
        of = f"{verdict['threshold'] * 100:g}% of the budget {fmt_bytes(verdict['budget_bytes'])}"
    else:
        of = "the budget"
    room = verdict["headroom_bytes"]
    head = "fits" if verdict["fits"] else "does NOT fit"
    side = f"{fmt_bytes(room)} to spare" if room >= 0 else f"{fmt_bytes(-room)} over"
    if not verdict["fits"] and verdict.get("fits_device"):
        side += ", though within the whole device"
    elif verdict.get("fits_device") is False:
        side += ", over the whole device too"
    return f"{head}: {what} vs limit {fmt_bytes(verdict['limit_bytes'])} ({of}), {side}"


def config_lines(cfg: dict[str, Any]) -> list[str]:
    """What a framework config file said: each key and what it became, the overrides, and
    the keys not modelled (the answer's `config`)."""
    lines = [f"read {cfg['path']} ({cfg['format']}): {len(cfg['keys'])} keys"]
    for k in cfg["keys"]:
        default = " (the framework's default)" if k.get("default") else ""
        lines.append(f"  {k['key']}: {k['value']!r} -> {k['became']}{default}")
    lines += [f"  override: {o}" for o in cfg["overrides"]]
    lines += [f"  not modelled: {w}" for w in cfg["warnings"]]
    return lines
