"""Fine-tuning: data, the training loop, checkpoints, run folders."""
from . import optim  # noqa: F401  (registers the 'adamw' optimizer with MXNet)
