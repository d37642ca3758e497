"""The governor inside loops it does not own: Lightning, the Hugging Face Trainer."""
