"""The runtime memory governor: predicts each training step's peak before it runs and keeps
it under the device's memory, by micro-batching, checkpointing and precision.

    from serving.governor import MemoryGovernor, GovernorConfig
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

from serving.governor.alerts import Alert, AlertConfig, StepRecord
from serving.governor.batching import BatchingConfig
from serving.governor.config import GovernorConfig
from serving.governor.core import MemoryGovernor
from serving.governor.correction import CorrectorConfig
from serving.governor.devices import (
    CpuDevice,
    CudaDevice,
    EmulatedDevice,
    GovernedDevice,
    resolve_device,
)
from serving.governor.loop import MicroBatch, StepPlan
from serving.governor.policy import PolicyConfig

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
