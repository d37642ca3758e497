"""Names shared by the recorder, the graph format and the features (no torch import here,
so loading a StepGraph stays cheap in a server worker), and the vocabularies every layer
speaks: the metrics a prediction is in, the data-dependent size scenarios, the batch-search
modes (each a `Literal` and its tuple of values, defined once here)."""

from typing import Literal, get_args

Metric = Literal["allocated", "reserved", "device_total"]
Scenario = Literal["min", "balanced", "worst"]
SearchMode = Literal["power", "binsearch"]
# How a data-parallel run splits the model across its ranks (predictor/emulate/parallel.py):
# ddp replicates everything; fsdp and zero3 shard parameters, gradients and optimizer
# state (FSDP2 fully_shard); hsdp shards inside groups and replicates across them; zero1
# shards the optimizer state; zero2 shards gradients and optimizer state; fsdp1 is
# FullyShardedDataParallel with flat parameters (its ShardingStrategy a separate option).
Sharding = Literal["none", "ddp", "fsdp", "hsdp", "zero1", "zero2", "zero3", "fsdp1"]
# How an answer is made: `replay` (the allocator simulator's exact bytes), `gnn` (the
# learned model), `analytic` (the liveness sweep); `auto` (asked for only) picks replay when
# its cost fits the request's budget, else the learned model (predictor/answer/exact.py)
Method = Literal["replay", "gnn", "analytic"]
MethodChoice = Literal["auto", "replay", "gnn", "analytic"]
METRICS: tuple[Metric, ...] = get_args(Metric)
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)
SHARDINGS: tuple[Sharding, ...] = get_args(Sharding)
METHODS: tuple[Method, ...] = get_args(Method)
METHOD_CHOICES: tuple[MethodChoice, ...] = get_args(MethodChoice)

CATEGORIES = (
    "parameter",
    "gradient",
    "optimizer_state",
    "input",
    "activation",
    "temporary",
    "comm",  # collective buffers: all-gather outputs, reduce-scatter inputs, DDP buckets
)
# The GNN's feature columns (fixed by the shipped model): `comm` counts as `temporary`.
FEATURE_CATEGORIES = CATEGORIES[:6]


def fold_comm(codes):  # numpy array of category codes -> codes within FEATURE_CATEGORIES
    """Category codes for the features: `comm` (code 6) folds into `temporary` (5)."""
    return codes.clip(max=len(FEATURE_CATEGORIES) - 1)


def category_bytes(values) -> dict[str, int]:
    """Bytes by category for a breakdown, in CATEGORIES order; `comm` only where a step has
    collective buffers (a single-GPU answer stays as it was before `comm` existed)."""
    out = {c: int(v) for c, v in zip(CATEGORIES, values, strict=False)}
    if not out.get("comm"):
        out.pop("comm", None)
    return out


# Where a storage lives. `device`: the CUDA caching allocator (every figure memgnn gave
# before offloading); `pinned`: page-locked host memory (`pin_memory=True`: save_on_cpu,
# torchtune's activation offloading, FSDP2's CPUOffloadPolicy, DeepSpeed's and torchao's
# offload buffers); `pageable`: ordinary host memory (an optimizer's state stepped on the
# CPU); `managed`: CUDA unified memory outside the allocator (bitsandbytes' paged optimizer
# states, `cudaMallocManaged`): on the device while resident, never in reserved bytes.
PLACES = ("device", "pinned", "pageable", "managed")
HOST_PLACES = ("pinned", "pageable")

PHASES = ("setup", "input", "forward", "backward", "optimizer", "zero_grad")

# aten ops that run through cuBLAS (and so allocate its workspace on first use)
MATMUL_OPS = ("mm.", "addmm.", "bmm.", "baddbmm.", "addbmm.", "_scaled_mm.", "addmv.", "mv.")


def cublas_workspaces(ops: list[str], phases: list[int]) -> int:
    """cuBLAS workspaces a CUDA step holds: one per thread (handle) that runs a matmul, the
    main thread's (forward, optimizer) and the autograd thread's (backward). A model
    without matmuls (convolutions only) has none."""
    backward = PHASES.index("backward")
    fwd = bwd = False
    for op, phase in zip(ops, phases, strict=True):
        if op.startswith(MATMUL_OPS):
            if phase == backward:
                bwd = True
            else:
                fwd = True
    return int(fwd) + int(bwd)
