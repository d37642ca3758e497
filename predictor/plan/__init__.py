"""The best training configuration under a memory limit, searched on predictions."""
