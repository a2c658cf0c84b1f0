"""The recipe package: a YAML recipe as typed, validated objects (see schema.py)."""
from .schema import *  # noqa: F401,F403
