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
