"""`memgnn dataset build|stats`: the profiling corpus (`memgnn.dataset.build`, `.stats`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from memgnn.dataset.build import CAP_NAMES, BuildConfig, build_corpus
from memgnn.dataset.corpus import Corpus
from memgnn.dataset.executors import EXECUTORS
from memgnn.dataset.pack import pack_corpus
from memgnn.dataset.presets import PRESETS, check_preset_flags, preset_kwargs
from memgnn.dataset.sampler import BACKENDS
from memgnn.dataset.stats import corpus_stats, integrity_problems, render_stats


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="corpus folder (created or resumed)")
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default=None,
        help="a named recipe that fixes size, backend, seed, sizes and caps per stage "
        "(dataset.presets; v2 is the corpus in dataset/data/corpus-v2)",
    )
    parser.add_argument("--size", type=int, default=None, help="number of jobs to sample")
    parser.add_argument("--backend", choices=BACKENDS, default=None, help="default: sim")
    parser.add_argument("--executor", choices=EXECUTORS, default="local")
    parser.add_argument("--workers", type=int, default=1, help="parallel workers (1: in-process)")
    parser.add_argument("--families", default=None, help="comma-separated zoo names (all)")
    parser.add_argument("--seed", type=int, default=None, help="default: 0")
    parser.add_argument("--address", default=None, help="Ray cluster address (--executor ray)")
    parser.add_argument("--chunk-size", type=int, default=16, help="rows per Parquet part")
    parser.add_argument("--devices", default=None, help="comma-separated device profiles")
    parser.add_argument("--sizes-per-config", type=int, default=None)
    for cap in CAP_NAMES:
        flag = "--" + cap.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help="sampler cap (see dataset.sampler)")
    parser.add_argument(
        "--hparam",
        action="append",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="pin a zoo hparam (repeatable), e.g. gpt2.layers=2",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-finetune",
        action="store_true",
        help="draw no LoRA / QLoRA / attention-kernel configs (the corpus before they existed)",
    )


def _split(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def _pinned(items: list[str]) -> dict[str, dict[str, Any]]:
    from memgnn.predictor.zoo import get_family

    raw: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        model, dot, name = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--hparam {item!r}: expected MODEL.KEY=VALUE")
        raw.setdefault(model.strip(), {})[name.strip()] = value.strip()
    return {model: get_family(model).coerce(args) for model, args in raw.items()}


def configs_from_args(args: argparse.Namespace) -> list[BuildConfig]:
    """The builds the CLI asks for: one, or each stage of `--preset`."""
    if getattr(args, "preset", None) is None:
        return [config_from_args(args)]
    check_preset_flags(args)
    run = dict(out=Path(args.out), executor=args.executor, workers=args.workers,
               ray_address=args.address, chunk_size=args.chunk_size,
               progress=not args.no_progress)  # fmt: skip
    return [BuildConfig(**kw) for kw in preset_kwargs(args.preset, **run)]


def config_from_args(args: argparse.Namespace) -> BuildConfig:
    if args.size is None:
        raise ValueError("--size is required (or --preset NAME)")
    caps = {cap: getattr(args, cap) for cap in CAP_NAMES if getattr(args, cap) is not None}
    return BuildConfig(
        out=Path(args.out),
        size=args.size,
        backend=args.backend or "sim",
        executor=args.executor,
        workers=args.workers,
        families=_split(args.families),
        seed=0 if args.seed is None else args.seed,
        ray_address=args.address,
        chunk_size=args.chunk_size,
        devices=_split(args.devices),
        sizes_per_config=args.sizes_per_config,
        caps=caps,
        hparams=_pinned(args.hparam),
        progress=not args.no_progress,
        finetune=not args.no_finetune,
    )


def build_cmd(args: argparse.Namespace) -> int:
    import json

    try:
        configs = configs_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summaries = []
    try:
        for cfg in configs:  # a preset's stages in order, into one folder
            summaries.append(build_corpus(cfg))
    except KeyboardInterrupt:
        print("interrupted: finished rows are saved; rerun to resume", file=sys.stderr)
        return 130
    except ValueError as exc:  # e.g. DIR holds another corpus format
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stages = [s.to_dict() for s in summaries]
    out = stages[0] if len(stages) == 1 else {"preset": args.preset, "stages": stages}
    print(json.dumps(out, indent=2))
    unrepaired = len(summaries[-1].graphs_unrepaired)  # the last stage checked every row
    if unrepaired:
        print(f"error: {unrepaired} graph(s) the corpus's rows name are still corrupt or "
              "missing (graphs_unrepaired)", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="corpus folder")
    parser.add_argument("--json", action="store_true", help="print the stats as JSON")
    parser.add_argument(
        "--allow-corrupt",
        action="store_true",
        help="exit 0 even if parts or graph files are corrupt (they are reported either way)",
    )


def stats_cmd(args: argparse.Namespace) -> int:
    """Print the stats; 2 on a bad folder, 1 on integrity problems unless allowed."""
    try:
        stats = corpus_stats(Corpus(args.dir))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(stats, indent=2) if args.json else render_stats(stats))
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): end quietly, as Unix tools do
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a tool ended by the pipe
    problems = integrity_problems(stats)
    if problems is None:
        return 0
    allowed = getattr(args, "allow_corrupt", False)
    hint = "" if allowed else "; `memgnn dataset build` repairs it, --allow-corrupt accepts it"
    print(f"{'warning' if allowed else 'error'}: corrupt corpus: {problems}{hint}",
          file=sys.stderr)  # fmt: skip
    return 0 if allowed else 1


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dataset_command", required=True)
    q = sub.add_parser("build", help="profile sampled configs into a corpus (resumable)")
    add_build_arguments(q)
    q.set_defaults(func=run_build)
    q = sub.add_parser("stats", help="summarise a corpus")
    add_stats_arguments(q)
    q.set_defaults(func=stats_cmd)
    q = sub.add_parser("pack", help="pack a corpus for the repository (one zstd part)")
    q.add_argument("src")
    q.add_argument("dst")
    q.add_argument("--preset", default=None, help="keep exactly this preset's jobs")
    q.set_defaults(func=pack_cmd)


def pack_cmd(args: argparse.Namespace) -> int:
    """`memgnn dataset pack SRC DST`: the manifest as JSON; 2 when SRC cannot be packed."""
    try:
        manifest = pack_corpus(args.src, args.dst, preset=args.preset)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(manifest, indent=2))
    return 0


def run_build(args: argparse.Namespace) -> int:
    """`memgnn dataset build`: SIGTERM (and SIGINT, which background jobs start with
    ignored) end the build the way Ctrl-C does: the rows already profiled are written."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    return build_cmd(args)
