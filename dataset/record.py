"""ProfileRecord: one measured (or simulated) training-step memory record, the corpus row.

Field names say the metric: `allocated` (sum of allocator blocks, or of live tensor
storages where there is no caching allocator), `reserved` (caching-allocator segments),
`device_total` (what nvidia-smi shows: reserved + CUDA context + libraries). All bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class ProfileRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    backend: str = Field(description="sim | cpu | cuda")
    device: str = Field(description="device profile name")
    device_name: str | None = Field(default=None, description="hardware name where measured")
    torch_version: str
    model: str
    family: str
    hparams: dict[str, Any] = Field(default_factory=dict)
    sizes: dict[str, int]
    train: dict[str, Any]
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_total_bytes: int | None = None
    breakdown: dict[str, Any] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(
        default_factory=dict,
        description="backend extras: num_alloc_retries, fragmentation, would_oom, ...",
    )
    graph_id: str | None = None
    seconds: float = 0.0
    error: str | None = None

    def contract(self) -> dict[str, Any]:
        """The `memgnn profile --json` output (contract fields first, then the rest)."""
        data = self.model_dump()
        head = {
            k: data.pop(k)
            for k in (
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "device_total_bytes",
                "breakdown",
                "backend",
                "device",
            )
        }
        return head | data
