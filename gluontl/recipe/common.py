"""What every part of the recipe schema shares: the strict base model, the stage names, and the
GluonCV-style "did you mean" hint its error messages end with."""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Literal, get_args

from pydantic import BaseModel, ConfigDict

GradReq = Literal["write", "null", "add"]
BNMode = Literal["train", "frozen"]
StageName = Literal["stem", "neck", "head"]  # neck: a detector's layers between backbone and heads
STEM, NECK, HEAD = get_args(StageName)
ParamKind = Literal["bias", "norm", "depthwise", "1d"]  # what rules.param_kinds finds in a layer
LAYER_TYPES = ("Conv", "Dense", "BatchNorm", "LayerNorm", "InstanceNorm", "GroupNorm", "Embedding",
               "PReLU", "RNN", "Deconv")


def suggest(word: Any, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'? valid: a, b, c)`` for a misspelt name, GluonCV-style."""
    valid = list(valid)
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6) if isinstance(word, str) else []
    return f" ({f'did you mean {close[0]!r}? ' if close else ''}valid: {', '.join(valid)})"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

