"""gluontl: parameter-granular fine-tuning for Apache MXNet Gluon."""
__version__ = "0.1.0"
