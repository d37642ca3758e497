"""Optimizer names a training spec accepts, and what each supports (no library imported
here but torch; `predictor.emulate.optimizers` builds them).

- memgnn's short names (`choices.OPTIMIZERS`): sgd (momentum 0.9), adam, adamw, adafactor,
  adamw8bit (bitsandbytes' 8-bit AdamW, emulated: `emulate.optim8bit`);
- any `torch.optim` class by name, with that class's defaults (`torch.optim.RMSprop`,
  `torch.optim.SGD` is plain SGD without momentum, so without state); refused where
  memgnn's loop cannot run it (SparseAdam: sparse gradients; LBFGS: a closure; Muon: 2-D
  parameters only, one optimizer over all trained parameters is not how it is used);
- bitsandbytes' classes, run by bitsandbytes' own code (`bnb.PagedAdamW8bit`, ...);
- torchao's low-bit AdamWs (`torchao.AdamW8bit`, `torchao.AdamW4bit`, `torchao.AdamWFp8`);
- lion-pytorch's `lion_pytorch.Lion`.
"""

from __future__ import annotations

import inspect

import torch
from memgnn.predictor.spec.choices import OPTIMIZER_IMPLS, OPTIMIZERS

__all__ = [
    "BNB_OPTIMIZERS",
    "LIBRARY_OPTIMIZERS",
    "OPTIMIZER_PATTERN",
    "TORCHAO_OPTIMIZERS",
    "TORCH_PREFIX",
    "check_optimizer",
    "impl_support",
    "torch_class",
]

TORCH_PREFIX = "torch.optim."
# bitsandbytes.optim classes (0.50.2): Adam-family two states, Lion one; 8bit: blockwise
# uint8 states for parameters of >= 4096 elements; Paged*: states of parameters of >= 1e5
# elements in CUDA unified memory
BNB_OPTIMIZERS = (
    "bnb.PagedAdamW",
    "bnb.PagedAdamW32bit",
    "bnb.PagedAdamW8bit",
    "bnb.PagedAdam",
    "bnb.PagedAdam8bit",
    "bnb.AdamW8bit",
    "bnb.Lion",
    "bnb.Lion8bit",
    "bnb.PagedLion",
    "bnb.PagedLion8bit",
)
TORCHAO_OPTIMIZERS = ("torchao.AdamW8bit", "torchao.AdamW4bit", "torchao.AdamWFp8")
LIBRARY_OPTIMIZERS = (*BNB_OPTIMIZERS, *TORCHAO_OPTIMIZERS, "lion_pytorch.Lion")
OPTIMIZER_PATTERN = (
    r"^("
    + "|".join(OPTIMIZERS)
    + r"|torch\.optim\.[A-Za-z][A-Za-z0-9_]{0,63}|"
    + "|".join(n.replace(".", r"\.") for n in LIBRARY_OPTIMIZERS)
    + r")$"
)
_REFUSED = {
    "SparseAdam": "it takes sparse gradients only (nn.Embedding(sparse=True)); memgnn's "
    "models give dense ones",
    "LBFGS": "its step re-evaluates the loss through a closure several times; memgnn's "
    "loop calls step() once without one",
    "Muon": "it takes 2-D parameters only and is paired with another optimizer for the "
    "rest; memgnn builds one optimizer over every trained parameter",
    "Optimizer": "it is the base class",
}


def torch_class(name: str) -> type[torch.optim.Optimizer] | None:
    """The torch.optim class of `torch.optim.<Class>` (None for any other name); a
    ValueError for a class torch.optim lacks or memgnn cannot run."""
    if not name.startswith(TORCH_PREFIX):
        return None
    short = name[len(TORCH_PREFIX) :]
    cls = getattr(torch.optim, short, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        known = sorted(
            n
            for n in dir(torch.optim)
            if isinstance(getattr(torch.optim, n), type)
            and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
            and n not in _REFUSED
        )
        raise ValueError(
            f"--optimizer {name}: torch {torch.__version__} has no optimizer "
            f"torch.optim.{short}; known: {', '.join(known)}"
        )
    if short in _REFUSED:
        raise ValueError(f"--optimizer {name} is not modelled: {_REFUSED[short]}")
    return cls


def impl_support(cls: type) -> tuple[bool, bool]:
    """(has a foreach implementation, has a fused one): the class's own constructor
    arguments say (`foreach=` / `fused=`)."""
    params = inspect.signature(cls.__init__).parameters
    return "foreach" in params, "fused" in params


def check_optimizer(name: str, impl: str) -> None:
    """A ValueError naming what is wrong with `--optimizer name --optimizer-impl impl`."""
    if impl not in OPTIMIZER_IMPLS:
        raise ValueError(
            f"unknown optimizer implementation {impl!r}; expected one of {OPTIMIZER_IMPLS}"
        )
    if not isinstance(name, str):
        raise ValueError(f"--optimizer must be a name, got {name!r}")
    cls = torch_class(name)
    if cls is not None:
        foreach, fused = impl_support(cls)
        if (impl == "foreach" and not foreach) or (impl == "fused" and not fused):
            raise ValueError(
                f"--optimizer {name} has no {impl} implementation in torch "
                f"{torch.__version__}; it has: "
                + ", ".join(["for-loop"] + ["foreach"] * foreach + ["fused"] * fused)
            )
        return
    if name not in OPTIMIZERS and name not in LIBRARY_OPTIMIZERS:
        short = name.rsplit(".", 1)[-1].lower()
        named = [*LIBRARY_OPTIMIZERS, *(TORCH_PREFIX + n for n in dir(torch.optim))]
        close = [n for n in named if n.rsplit(".", 1)[-1].lower() == short]
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ValueError(
            f"unknown optimizer {name!r}{hint}; expected one of {', '.join(OPTIMIZERS)}, "
            f"torch.optim.<Class> or {', '.join(LIBRARY_OPTIMIZERS)}"
        )
    if (name in LIBRARY_OPTIMIZERS or name == "adamw8bit") and impl != "auto":
        library = {"bnb": "bitsandbytes'", "adamw8bit": "bitsandbytes'"}.get(
            name.split(".")[0], f"{name.split('.')[0]}'s"
        )
        raise ValueError(
            f"--optimizer {name} runs {library} own kernel: "
            f"--optimizer-impl must be auto, got {impl!r}"
        )
    if name == "adafactor" and impl == "fused":
        raise ValueError("adafactor has no fused implementation")
