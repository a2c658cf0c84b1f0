"""Fine-tuning: data loading, transforms and the training loop."""
