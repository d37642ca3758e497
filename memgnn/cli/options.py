"""The options the model commands share (model, sizes, training, memory limit, capture
cache) and their parsing into a model bundle, sizes and a `TrainSpec`. The training flags
are made from the spec's options (`predictor.spec.train.OPTIONS`): one flag per option,
`explicit_train_options` tells the flags given from those left at their default."""

from __future__ import annotations

import argparse

from memgnn.predictor.answer.runconfig import RunConfig
from memgnn.predictor.answer.types import ModelRef
from memgnn.predictor.errors import UserError
from memgnn.predictor.frameworks.base import FORMATS
from memgnn.predictor.ir.vocab import METRICS, SCENARIOS
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.devices import custom_profile
from memgnn.predictor.spec.limits import MemoryLimit, resolve_limit
from memgnn.predictor.spec.options import append_items
from memgnn.predictor.spec.train import BY_NAME, OPTIONS, TrainSpec
from memgnn.predictor.zoo import resolve


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def add_model_args(p: argparse.ArgumentParser, *, config: bool = False) -> None:
    """--model (with `config`: optional, a --config file may name it), --model-arg, --task,
    and with `config` the run as its framework states it: --config, --config-format,
    --adapter-config."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", required=not config,
        help="zoo name, hf:ORG/NAME (the catalog), hf:PATH/config.json or py:mod:fn"
        + ("; optional with --config when the file names the model" if config else ""),
    )  # fmt: skip
    g.add_argument("--model-arg", action="append", type=_key_value, default=[], metavar="K=V")
    g.add_argument("--task", default=None, help="for hf: specs (causal-lm, seq-cls, ...)")
    if config:
        g = p.add_argument_group("the run as its framework states it")
        g.add_argument(
            "--config", default=None, metavar="FILE",
            help="a framework's config file: HF TrainingArguments / TRL (JSON or YAML), "
            "torchtune recipe YAML, torchtitan TOML, axolotl YAML, LitGPT YAML; every key is "
            "read (the answer lists them); a flag given here overrides the file's key",
        )  # fmt: skip
        g.add_argument("--config-format", default=None, choices=FORMATS,
                       help="the file's framework (default: detected)")  # fmt: skip
        g.add_argument(
            "--adapter-config", default=None, metavar="FILE",
            help="a PEFT adapter_config.json for an HF/TRL file (default: one beside it)",
        )  # fmt: skip


def run_config(args: argparse.Namespace) -> RunConfig | None:
    """The --config file, if given (`predictor.answer.runconfig.RunConfig`)."""
    if getattr(args, "config", None) is None:
        if getattr(args, "model", None) is None:
            raise UserError("give --model SPEC, or --config FILE that names the model")
        return None
    return RunConfig.from_path(args.config, args.config_format, args.adapter_config)


def add_size_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sizes")
    g.add_argument("--batch", type=int, default=None, help="batch size (symbol B)")
    g.add_argument("--seq", type=int, default=None, help="sequence length (symbol S)")
    g.add_argument("--image", type=int, default=None, help="image size (model hparam)")
    g.add_argument("--dim", action="append", type=_key_value, default=[], metavar="SYM=N")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def add_train_args(p: argparse.ArgumentParser) -> None:
    """One flag per training option (`predictor.spec.train.OPTIONS`), in its group.

    Defaults are None (SUPPRESS-like) so `explicit_train_options` can tell a flag the user
    gave from one left at its default: a config file's values count unless a flag overrides."""
    for group in dict.fromkeys(o.group for o in OPTIONS):
        g = p.add_argument_group(f"training: {group}")
        for o in (o for o in OPTIONS if o.group == group and o.cli != "none"):
            kw: dict = {"dest": o.dest, "default": None, "help": _help(o)}
            if o.cli == "switch":
                kw["action"] = "store_const"
                kw["const"] = True
            elif o.cli == "bool":
                kw.update(type=_bool, metavar="true|false")
            elif o.cli == "append":  # repeatable NAME=VALUE; the spec makes one value of them
                kw.update(action="append", metavar="NAME=VALUE")
            elif o.cli_values is not None:
                kw["choices"] = tuple(o.cli_values)
            elif o.choices is not None:
                kw.update(choices=o.choices, type=o.type)
            else:
                kw["type"] = o.type
            g.add_argument(o.flag, **kw)


def _help(o) -> str:
    shown = _flag_value(o, o.default)
    return f"{o.help} (default: {shown})".replace("%", "%%")


def _flag_value(o, value):
    if o.cli_values is not None:
        return next(k for k, v in o.cli_values.items() if v == value)
    if o.cli == "switch":
        return "off" if not value else "on"
    return str(value).lower() if isinstance(value, bool) else value


def explicit_train_options(args: argparse.Namespace) -> dict:
    """{option name: value} for each training flag given on the command line."""
    out = {}
    for o in OPTIONS:
        if o.cli == "none":
            continue
        value = getattr(args, o.dest, None)
        if value is None:
            continue
        out[o.name] = o.cli_values[value] if o.cli_values is not None else value
    return out


def option_flags(options: dict, *, defaults: bool = False) -> list[str]:
    """The command-line flags that set `options` ({option name: value}), skipping values
    at their default: the inverse of `explicit_train_options`. `defaults`: state those too
    where a flag can (over a config file, whose reading may differ from the default)."""
    out: list[str] = []
    for name, value in options.items():
        o = BY_NAME[name]
        if value == o.default and (not defaults or o.cli in ("switch", "append")):
            continue
        if o.cli == "none":
            raise ValueError(f"training option {name} has no command-line flag")
        if o.cli == "switch":
            out.append(o.flag)
        elif o.cli == "append":
            out += [w for item in append_items(value) for w in (o.flag, item)]
        else:
            out += [o.flag, str(_flag_value(o, value))]
    return out


def train_spec(args: argparse.Namespace) -> TrainSpec:
    """The TrainSpec of the training flags (defaults where a flag was not given)."""
    return TrainSpec.of(**explicit_train_options(args))


BUDGET_HELP = (
    "memory budget: bytes with a unit (24GiB, 68GB) or >= 1024 without (8e9), or a fraction "
    "of the device: 50%% or 0.5; a bare small integer such as 1 is refused as ambiguous"
)
THRESHOLD_HELP = (
    "fraction 0 < F <= 1 of the device's memory the bound may reach (0.85: 85%% of an "
    "80 GiB card); not with --budget"
)


def add_limit_args(p: argparse.ArgumentParser, what: str) -> None:
    """--budget / --threshold (mutually exclusive, checked by `predictor.spec.limits`)."""
    g = p.add_argument_group(f"memory limit ({what})")
    g.add_argument("--budget", default=None, help=BUDGET_HELP)
    g.add_argument("--threshold", type=float, default=None, help=THRESHOLD_HELP)


def memory_limit(args: argparse.Namespace, device, *, required: bool = False) -> MemoryLimit | None:
    """The `predictor.spec.limits.MemoryLimit` of --budget / --threshold on `device` (or None)."""
    return resolve_limit(
        budget=args.budget,
        threshold=args.threshold,
        device_total=device.total_bytes,
        device=device.name,
        required=required,
    )


DEVICE_HELP = "device profile (default: %(default)s; `memgnn devices` lists them)"


def add_device_args(p: argparse.ArgumentParser, default: str | None = "h100-80gb",
                    help: str = DEVICE_HELP) -> None:  # fmt: skip
    """--device, or any other GPU by its size: --device-memory with --compute-capability."""
    g = p.add_argument_group("device")
    g.add_argument("--device", default=default, help=help)
    g.add_argument(
        "--device-memory", default=None, metavar="SIZE",
        help="a GPU not in the profiles, by the memory it reports (48GiB, 49140MiB, bytes); "
        "replaces --device",
    )  # fmt: skip
    g.add_argument(
        "--compute-capability", default=None, metavar="X.Y",
        help="with --device-memory: the GPU's compute capability (8.9; default 8.0, said in "
        "the answer)",
    )  # fmt: skip


def device_name(args: argparse.Namespace) -> str | None:
    """The profile name --device / --device-memory name (`custom-48gib-sm89` for the
    latter, a name every layer resolves with `get_profile`)."""
    memory, cc = getattr(args, "device_memory", None), getattr(args, "compute_capability", None)
    if memory is None:
        if cc is not None:
            raise UserError("--compute-capability goes with --device-memory")
        return args.device
    try:
        sm = None if cc is None else round(float(cc) * 10)
    except ValueError:
        raise UserError(f"--compute-capability must look like 8.9, got {cc!r}") from None
    return custom_profile(memory, sm).name


METRIC_HELP = (
    "allocated | reserved | device_total (default: reserved on a GPU profile, allocated on cpu)"
)


def add_query_args(p: argparse.ArgumentParser) -> None:
    """What `predict` and `explain` both ask: the model (or a --config file), the sizes,
    the training options, the device, the metric and the scenario."""
    add_model_args(p, config=True)
    add_size_args(p)
    add_train_args(p)
    add_device_args(p)
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
    p.add_argument(
        "--scenario", choices=SCENARIOS, default="worst",
        help="data-dependent sizes at their min | balanced | worst (default: %(default)s)",
    )  # fmt: skip


def model_ref(args: argparse.Namespace) -> ModelRef | None:
    """The --model flags as the answer layer takes them (None: the --config file's)."""
    if args.model is None:
        return None
    return ModelRef(spec=args.model, args=model_args(args), task=args.task)


def resolve_bundle(args: argparse.Namespace) -> ModelBundle:
    """The model the --model / --model-arg / --task flags name."""
    return resolve(args.model, model_args(args), args.task)


def add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="capture anew, store nothing (the cache: $MEMGNN_CACHE, default ~/.cache/memgnn)",
    )
    p.add_argument(
        "--capture",
        choices=("blocks", "full"),
        default="blocks",
        help="blocks (default): a model whose layers are alike is captured at 4 layers and "
        "its repeated layer replicated (full capture where that is not shown exact); "
        "full: capture every layer",
    )


def _int_value(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def parse_sizes(args: argparse.Namespace) -> dict[str, int]:
    sizes: dict[str, int] = {}
    if args.batch is not None:
        sizes["B"] = args.batch
    if args.seq is not None:
        sizes["S"] = args.seq
    for key, value in args.dim:
        sizes[key] = _int_value(f"--dim {key}", value)
    for key, value in sizes.items():
        if value < 1:
            raise ValueError(f"size {key} must be >= 1, got {value}")
    return sizes


def model_args(args: argparse.Namespace) -> dict[str, str]:
    out = dict(args.model_arg)
    if getattr(args, "image", None) is not None:
        if args.image < 1:
            raise ValueError(f"--image must be >= 1, got {args.image}")
        out["image"] = str(args.image)
    return out


__all__ = [
    "DEVICE_HELP",
    "add_device_args",
    "device_name",
    "METRIC_HELP",
    "add_cache_args",
    "resolve_bundle",
    "add_limit_args",
    "add_model_args",
    "add_query_args",
    "add_size_args",
    "add_train_args",
    "explicit_train_options",
    "memory_limit",
    "model_args",
    "model_ref",
    "run_config",
    "option_flags",
    "parse_sizes",
    "train_spec",
]
