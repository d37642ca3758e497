"""The runtime memory governor: predicts each training step's peak before it runs and keeps
it under the device's memory, by micro-batching, checkpointing and precision.

    from memgnn.serving.governor import MemoryGovernor, GovernorConfig
    gov = MemoryGovernor(bundle, TrainSpec(), device="cuda")
    record = gov.step(batch)                 # the governor runs the step, or
    for plan in gov.plan(batch):             # you run it (see serving.governor.loop)
        with plan: ...

Modules: `core` (MemoryGovernor), `config` (GovernorConfig and the nested component
configs), `policy` (the decision rule), `correction` (cached, corrected predictions),
`observe` (measure, correct, alert, record), `alerts` (records, alerts, sinks), `batching`
(length buckets, token batches, micro-batch splits), `runtime` (checkpoint toggles, elastic
precision, overflow), `loop` (the user-owned loop), `checks` (model and optimizer against
the prediction), `devices` / `cuda` (the devices it reads), `demo` (the demo workload),
`integrations/` (Lightning, Hugging Face, the monitor they share).
"""

from memgnn.serving.governor.alerts import Alert, AlertConfig, StepRecord
from memgnn.serving.governor.batching import BatchingConfig
from memgnn.serving.governor.config import GovernorConfig
from memgnn.serving.governor.core import MemoryGovernor
from memgnn.serving.governor.correction import CorrectorConfig
from memgnn.serving.governor.devices import (
    CpuDevice,
    CudaDevice,
    EmulatedDevice,
    GovernedDevice,
    resolve_device,
)
from memgnn.serving.governor.loop import MicroBatch, StepPlan
from memgnn.serving.governor.policy import PolicyConfig

__all__ = [
    "Alert",
    "AlertConfig",
    "BatchingConfig",
    "CorrectorConfig",
    "CpuDevice",
    "CudaDevice",
    "EmulatedDevice",
    "GovernedDevice",
    "GovernorConfig",
    "MemoryGovernor",
    "MicroBatch",
    "PolicyConfig",
    "StepPlan",
    "StepRecord",
    "resolve_device",
]
