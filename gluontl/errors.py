"""User-facing errors.

Every error a user can cause is a ``GluontlError``: the CLI prints its message as one
paragraph and exits with code 2, never a traceback. Messages name the file, key or
parameter at fault and say what to do. ``Interrupted`` is the stop a user asks for
(exit code 128 + signal); ``short_reason`` turns library exceptions into one sentence
for such messages.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path


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


class AdapterError(GluontlError):
    """An adapter does not fit its layer, or an adapter file does not fit the model."""


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


class SweepError(GluontlError):
    """A sweep's space, storage or folder is not usable (``gluontl sweep``)."""


class LaunchError(GluontlError):
    """``gluontl launch`` got bad input (exit code 2), or a process of its job failed or it was
    stopped: then the code is 1, 2 when the failed worker refused its input, or 128 + signal."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(Exception):
    """``finetune`` stopped on SIGINT/SIGTERM after writing its checkpoint.

    Raised, not returned, so a run that makes its weights first (``weights_from``) stops
    too, and the CLI exits 128 + signal number as shells expect (130, 143).
    """

    def __init__(self, run_dir: Path, signum: int, workers: int, checkpoints: Path) -> None:
        """``checkpoints``: where the run folder keeps them (``RunFolder.checkpoints_dir``)."""
        self.run_dir, self.signum = run_dir, signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; the checkpoint is in {checkpoints}. "
                         f"Resume with: {resume_command(run_dir, workers)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def resume_command(run_dir: Path, workers: int = 1) -> str:
    """What continues a run: a distributed one on as many workers as it had."""
    launch = f"gluontl launch -n {workers} -- " if workers > 1 else "gluontl "
    return f"{launch}finetune --resume {run_dir}"


_NOT_A_REASON = ("Traceback (most recent call last)", 'File "', "[bt]", "Stack trace")
_MX_NOISE = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: |\b(MXNet|LocalFileSystem)\w*: |Check failed: .*?\s?: :?")


def short_reason(err: BaseException, limit: int = 200) -> str:
    """An exception's text as one sentence for a user message.

    MXNet's errors quote a C++ traceback and ``Check failed: <condition>`` lines; users
    need the message at their end, not the source locations.
    """
    lines = [s.strip() for s in str(err).splitlines()]
    text = " ".join(s for s in lines if s and not s.startswith(_NOT_A_REASON))
    text = " ".join(_MX_NOISE.sub("", text).split()).rstrip(".") or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def hwc_hint(chw: tuple[int, ...]) -> str:
    """Image libraries hand out channels-last shapes (224,224,3); gluontl's, as MXNet's, are C,H,W."""
    if len(chw) == 3 and chw[2] in (1, 3, 4) and chw[0] not in (1, 3, 4):
        return (f" {','.join(map(str, chw))} looks like H,W,C; gluontl takes channels first, C,H,W: "
                f"{chw[2]},{chw[0]},{chw[1]}.")
    return ""
