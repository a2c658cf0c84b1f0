"""What an export wrote and what it refused, typed, so the CLI, the API and a run's record read one
answer instead of guessing an artifact's kind from its file name.

An export writes every artifact whose verdict holds; a refused one (an int8 model past
``max_drop``) is named with its numbers and what to try, and takes nothing else down with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from gluontl.errors import ExportError

Precision = Literal["float", "int8"]


@dataclass(frozen=True)
class Artifact:
    """One deployable model: its files (the one to load first), its format's registry name, its
    precision and the check it passed (one line)."""

    format: str
    precision: Precision
    files: tuple[Path, ...]
    verdict: str

    @property
    def path(self) -> Path:
        return self.files[0]

    def moved(self, old: Path, new: Path) -> "Artifact":
        """The same artifact with its files moved from folder ``old`` to ``new`` (subfolders kept)."""
        return Artifact(self.format, self.precision, tuple(new / f.relative_to(old) for f in self.files), self.verdict)


@dataclass(frozen=True)
class Refusal:
    """An artifact that was asked for and not written: ``reason`` gives its numbers and what to try."""

    format: str
    precision: Precision
    reason: str


class Exported(list):
    """The written files in order (a ``list`` of ``Path``, what export functions returned before)
    with the ``artifacts`` they make up, the int8 ``reports`` beside them and the ``refused``."""

    def __init__(self, artifacts: Iterable[Artifact] = (), refused: Iterable[Refusal] = ()) -> None:
        super().__init__()
        self.artifacts: list[Artifact] = []
        self.refused: list[Refusal] = list(refused)
        for a in artifacts:
            self.add(a)

    def add(self, artifact: Artifact) -> Artifact:
        self.artifacts.append(artifact)
        self.extend(artifact.files)
        return artifact

    def extend_result(self, other: "Exported") -> None:
        for a in other.artifacts:
            self.add(a)
        self.refused += other.refused

    def unmet(self) -> list[Refusal]:
        """The refusals that leave a precision asked for with no artifact at all: ``--format onnx
        --int8`` whose int8 file was refused, or ``--int8`` with every int8 model refused. A refused
        int8 symbol beside a written int8 ONNX file is reported but not a failure."""
        made = {a.precision for a in self.artifacts}
        return [r for r in self.refused if r.precision not in made]

    def failure(self) -> ExportError | None:
        """The error the CLI exits 2 with (after listing what was written), or None."""
        unmet = self.unmet()
        if not unmet:
            return None
        kept = ", ".join(str(a.path) for a in self.artifacts) or "nothing"
        return ExportError(" ".join(r.reason for r in unmet) + f" (Written: {kept}.)")

