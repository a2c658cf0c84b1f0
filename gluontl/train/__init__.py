"""The engine: the training loop, schedules and EMA, run folders and what a finished run does."""
from . import optim  # noqa: F401  (registers the 'adamw' optimizer with MXNet)
