"""Names shared by the recorder, the graph format and the features (no torch import here,
so loading a StepGraph stays cheap in a server worker)."""

CATEGORIES = (
    "parameter",
    "gradient",
    "optimizer_state",
    "input",
    "activation",
    "temporary",
)
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
