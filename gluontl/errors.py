"""User-facing errors.

Every error a user can cause is a ``GluontlError``: the CLI prints its message as one
paragraph and exits with code 2, never a traceback. Messages name the file, key or
parameter at fault and say what to do.
"""
from __future__ import annotations


class GluontlError(Exception):
    """Base of all errors caused by user input (files, recipes, names, data)."""

    exit_code = 2


class RecipeError(GluontlError):
    """The recipe file is unreadable, malformed, or asks for something impossible."""


class ModelSourceError(GluontlError):
    """A model could not be obtained (bad spec, missing/corrupt files, offline download)."""


class RestoreError(GluontlError):
    """Selective restore found missing/mismatched names that the recipe did not expect."""


class RuleError(GluontlError):
    """A rule matches nothing, or asks for a setting its parameters cannot take."""


class OnnxImportError(GluontlError):
    """An ONNX file cannot be imported (malformed, unsupported ops, dynamic shapes)."""


class SurgeryError(GluontlError):
    """A cut point, dropped layer or head does not fit the model."""


class ExportError(GluontlError):
    """Export failed, would overwrite a file, or did not verify against onnxruntime."""


class DataError(GluontlError):
    """A dataset is missing, empty, or contains unreadable items under policy ``error``."""


class TrainError(GluontlError):
    """Training cannot proceed (diverged, incompatible resume, unwritable run folder)."""
