"""`GovernorConfig`: every knob of the runtime memory governor, validated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.spec import PRECISIONS, TrainSpec
from serving.governor_predict import CorrectorConfig

# precisions the governor can switch between at run time (parameters stay in their dtype)
RUNTIME_PRECISIONS = ("fp32", "amp-bf16", "amp-fp16")


@dataclass(kw_only=True, slots=True)
class GovernorConfig:
    # decisions
    threshold: float = 0.85  # corrected bounds stay under this fraction of device memory
    margin: float = 0.05  # extra headroom on every bound (x (1 + margin))
    mode: str = "power"  # search on predictions: power | binsearch
    power_of_two: bool = True  # micro-batch granularity
    max_batch: int = 1024
    stability_window: int = 20  # steps before a bucket may grow again (10-50)
    growth: float = 2.0  # at most this factor per growth (halved after an OOM)
    checkpointing: list[str] = field(default_factory=lambda: ["none", "full"])
    precision: list[str] | None = None  # None: the TrainSpec's precision only
    keep_effective_batch: bool = False  # batches(): every step sees `effective_batch` samples
    effective_batch: int | None = None
    sizes: dict[str, int] = field(default_factory=dict)  # other fixed input sizes
    # variable lengths
    length_buckets: list[int] | None = None  # bucket upper bounds; None: geometric
    max_length: int = 4096
    bucket_ratio: float = 1.25
    bucket_multiple: int = 16
    # prediction and live correction
    metric: str | None = None  # None: the device's default (reserved on a GPU profile)
    scenario: str = "worst"
    corrector: CorrectorConfig = field(default_factory=CorrectorConfig)
    sample_every: int = 1  # measure the peak every this many steps
    fragmentation_every: int = 50  # read fragmentation every this many samples
    prepare_all: bool = False  # capture every graph of the search space at start
    cache_dir: Path | None = None  # captured graphs (default: $MEMGNN_CACHE)
    # rollback
    max_retries: int = 6
    # alerts
    tiers: tuple[float, float, float] = (0.70, 0.80, 0.90)  # log | optimize | pause
    fragmentation_warn: float = 0.30
    fragmentation_min_free: float = 0.05  # of capacity: less free cache is not worth a warning
    # release cached free segments on a fragmentation warning, and before a step of a new
    # shape that must reuse the cache (costs cudaMalloc calls on a GPU; off: never)
    defragment: bool = True
    recompute_warn: float = 0.35
    overflow_window: int = 100
    overflow_alert_rate: float = 0.01
    overflow_sustained: int = 3  # overflows in the window that move sensitive layers to fp32
    elastic_precision: bool = True
    alert_cooldown: int = 50
    keep_records: int = 10_000
    # callbacks
    on_pause: Callable[[Any], None] | None = None  # tier 3: called before shrinking
    on_alert: Callable[[Any], None] | None = None
    on_record: Callable[[Any], None] | None = None  # each StepRecord (e.g. mlflow_sink())
    on_sample: Callable[[dict[str, Any]], None] | None = None  # e.g. HttpSampleSink(url)

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.mode not in ("power", "binsearch"):
            raise ValueError(f"mode must be power or binsearch, got {self.mode!r}")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not 1 <= self.stability_window <= 10_000:
            raise ValueError("stability_window must be in [1, 10000] (10-50 is typical)")
        if self.growth <= 1:
            raise ValueError(f"growth must be > 1, got {self.growth}")
        if not self.checkpointing:
            raise ValueError("checkpointing choices must not be empty")
        for c in self.checkpointing:
            TrainSpec(checkpointing=c)
        for p in self.precision or ():
            if p not in PRECISIONS:
                raise ValueError(f"unknown precision {p!r}")
            if p not in RUNTIME_PRECISIONS:
                raise ValueError(
                    f"precision {p!r} changes parameter dtypes; the governor switches only "
                    f"between {RUNTIME_PRECISIONS}"
                )
        if self.effective_batch is not None and self.effective_batch < 1:
            raise ValueError("effective_batch must be >= 1")
        if self.keep_effective_batch and self.effective_batch is None:
            raise ValueError("keep_effective_batch needs effective_batch")
        if self.length_buckets is not None and (
            not self.length_buckets or min(self.length_buckets) < 1
        ):
            raise ValueError("length_buckets must be positive lengths")
        if self.bucket_ratio <= 1 or self.bucket_multiple < 1 or self.max_length < 1:
            raise ValueError("need bucket_ratio > 1, bucket_multiple >= 1, max_length >= 1")
        if self.sample_every < 1 or self.fragmentation_every < 1:
            raise ValueError("sample_every and fragmentation_every must be >= 1")
        if self.max_retries < 1:
            raise ValueError("max_retries must be >= 1")
        t1, t2, t3 = self.tiers
        if not 0 < t1 <= t2 <= t3 <= 1.5:
            raise ValueError(f"tiers must be increasing fractions, got {self.tiers}")
        if not 0 <= self.fragmentation_warn <= 1 or not 0 <= self.fragmentation_min_free <= 1:
            raise ValueError("fragmentation_warn and fragmentation_min_free must be in [0, 1]")
        if self.recompute_warn <= 0:
            raise ValueError("recompute_warn must be > 0")
        if self.overflow_window < 1 or self.overflow_sustained < 1:
            raise ValueError("overflow_window and overflow_sustained must be >= 1")
        if not 0 <= self.overflow_alert_rate <= 1:
            raise ValueError("overflow_alert_rate must be in [0, 1]")
        if self.alert_cooldown < 0 or self.keep_records < 1:
            raise ValueError("alert_cooldown must be >= 0 and keep_records >= 1")
        if self.scenario not in ("min", "balanced", "worst"):
            raise ValueError(f"unknown scenario {self.scenario!r}")
