"""Third-party log lines that say nothing to a memgnn user, filtered one by one.

Each entry names a library logger (exactly: a logger's filters do not see the records of
its children) and the start of a message it emits on import on a machine without its
optional kernels (no CUDA, no triton, no `kernels` package). They are about the library's
own fast paths, which a prediction never runs; printed on every `predict`, they made users
think something had failed. Only these messages are dropped, only from these loggers, and
none with the CLI's `--verbose`; the service's capture workers filter them too. Everything
else a library logs still shows. Python warnings (`warnings.warn`) are filtered by
category, message and module the same way.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["NOISE", "filter_noise"]

# (logger, message prefix)
NOISE: tuple[tuple[str, str], ...] = (
    ("torchao", "Failed to load "),  # torchao's CUDA extension (.so) on a CPU machine
    ("torchao.kernel.intmm", "Warning: Detected no triton"),
    (
        "bitsandbytes.backends.cpu.ops",
        "Failed to load CPU gemm_4bit_forward from kernels-community",
    ),
    ("torch.utils._pytree", "%s is an Enum subclass"),  # torchao registering its enums
)
# (warning category, message regex, module regex) for warnings.filterwarnings
WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # peft's QLoRA preparation asks transformers 5 by the method's old name
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\."),
)


class _Drop(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def filter_noise() -> None:
    """Install the filters (idempotent)."""
    for name, prefix in NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_Drop(prefix))
    for category, message, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
