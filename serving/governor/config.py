"""`GovernorConfig`: every knob of the runtime memory governor, validated.

The knobs of each component live in that component's own config, nested here:
`policy` (`PolicyConfig`: threshold, search, granularity, checkpointing and precision
choices), `batching` (`BatchingConfig`: length buckets, effective batch), `corrector`
(`CorrectorConfig`: the online residual correction) and `alerts` (`AlertConfig`: tiers,
fragmentation, recompute, AMP overflow). What remains at the top is the governor's own:
what it predicts, how often it measures, how it recovers, and the callbacks.

    GovernorConfig(policy=PolicyConfig(max_batch=64), batching=BatchingConfig(max_length=512))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgnn.predictor.ir.vocab import SCENARIOS
from memgnn.serving.governor.alerts import AlertConfig
from memgnn.serving.governor.batching import BatchingConfig
from memgnn.serving.governor.correction import CorrectorConfig
from memgnn.serving.governor.policy import PolicyConfig

__all__ = ["AlertConfig", "BatchingConfig", "CorrectorConfig", "GovernorConfig", "PolicyConfig"]


@dataclass(kw_only=True, slots=True)
class GovernorConfig:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    corrector: CorrectorConfig = field(default_factory=CorrectorConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    # prediction and live measurement
    margin: float = 0.05  # extra headroom on every bound (x (1 + margin))
    metric: str | None = None  # None: the device's default (reserved on a GPU profile)
    scenario: str = "worst"
    sample_every: int = 1  # measure the peak every this many steps
    fragmentation_every: int = 50  # read fragmentation every this many samples
    prepare_all: bool = False  # capture every graph of the search space at start
    cache_dir: Path | None = None  # captured graphs (default: $MEMGNN_CACHE)
    # recovery
    max_retries: int = 6
    # release cached free segments on a fragmentation warning, and before a step of a new
    # shape that must reuse the cache (costs cudaMalloc calls on a GPU; off: never)
    defragment: bool = True
    keep_records: int = 10_000
    # callbacks
    on_pause: Callable[[Any], None] | None = None  # tier 3: called before shrinking
    on_alert: Callable[[Any], None] | None = None
    on_record: Callable[[Any], None] | None = None  # each StepRecord (e.g. mlflow_sink())
    on_sample: Callable[[dict[str, Any]], None] | None = None  # e.g. HttpSampleSink(url)

    def __post_init__(self) -> None:
        for name, kind in (
            ("policy", PolicyConfig),
            ("batching", BatchingConfig),
            ("corrector", CorrectorConfig),
            ("alerts", AlertConfig),
        ):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.sample_every < 1 or self.fragmentation_every < 1:
            raise ValueError("sample_every and fragmentation_every must be >= 1")
        if self.max_retries < 1:
            raise ValueError("max_retries must be >= 1")
        if self.keep_records < 1:
            raise ValueError("keep_records must be >= 1")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}")
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)
