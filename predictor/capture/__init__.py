"""One training step as real code runs it, recorded on fake tensors as a `StepGraph`."""
