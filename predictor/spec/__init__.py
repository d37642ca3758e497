"""What to predict: the training spec, the model bundle, device profiles, limits."""
