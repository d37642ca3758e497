"""The graph representation: size expressions, the op recorder, `StepGraph`."""
