"""A run's card, ``preprocess.json``: its evaluation preprocessing and class names, with the input
named as its exports name it. Written when a run starts (each task's ``run_card``) and read back by
evaluate, predict and export of every task."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelSourceError, TrainError
from ..readers import read_json
from ..recipe import DataSpec, Recipe
from ..runfolder import RunFolder
from ..sources import model_input_name
from .datasets import load_split
from .transforms import Preprocess, load_preprocess, model_card


def recipe_data(recipe: Recipe, run_dir: str | Path) -> DataSpec:
    if recipe.data is None:
        raise TrainError(f"'{RunFolder(run_dir).recipe_path}' has no data: section, so there are no splits or "
                         f"class names to use; add the data: section the run was trained with.")
    return recipe.data


def run_card(recipe: Recipe, data: DataSpec, class_names: list[str]) -> dict[str, Any]:
    """A run's ``preprocess.json``: the evaluation preprocessing of ``data`` (the recipe's) and
    the class names, the input named as the run's exports name it."""
    return model_card(data.val_transform, class_names, export_input_name(recipe), recipe.model.input_shape)


def stored_card(run_dir: str | Path, recipe: Recipe) -> dict[str, Any]:
    """The run folder's ``preprocess.json`` (checked); runs from before it was written get it
    computed from the recipe and the training split's class names."""
    path = RunFolder(run_dir).card_path
    if path.is_file():
        if load_preprocess(path)[1] is None:  # which also refuses an edited or foreign record
            raise TrainError(f"'{path}' has no \"classes\" list; it was edited. Delete it to have it computed "
                             f"from {RunFolder(run_dir).recipe_path} and the training data.")
        return read_json(path, TrainError, "the run card")
    if recipe.task != "classification":  # runs from before the card were classifiers; a card is the task's
        raise TrainError(f"'{path}' is missing: a {recipe.task} run writes it when it starts, with the class names "
                         f"and preprocessing its model was trained on. Put it back from a copy of the run folder.")
    data = recipe_data(recipe, run_dir)
    return run_card(recipe, data, load_split(data, data.train).class_names)


def export_input_name(recipe: Recipe) -> str:
    return recipe.export.input_names[0] if recipe.export.input_names else model_input_name(recipe.model)


def resized_input(card: dict[str, Any], where: str, model: str, task: str) \
        -> tuple[Preprocess, list[str], tuple[int, int]]:
    """The normalization, class names and input (H, W) of a card whose model resizes every image
    to its input (a detector, a segmenter: no steps, an input shape with H and W); predict from a
    run folder and from its ONNX file both read the card here, so they feed identical tensors.
    Any other record is refused naming ``where``, the ``model`` it should be for and the ``task``
    run to export again."""
    prep, names = load_preprocess(card)
    record = card["preprocess"].get("input")
    shape = record.get("shape") if isinstance(record, dict) else None
    if prep.steps or names is None or not (isinstance(shape, list) and len(shape) == 4
                                           and all(isinstance(d, int) and d > 0 for d in shape[2:])):
        raise ModelSourceError(f"The preprocessing record of {where} is not a {model}'s (steps {list(prep.steps)}, "
                               f"input shape {shape!r}, classes {names!r}): a {model} resizes every image to its "
                               f"input H, W and lists its classes. Export the {task} run again.")
    return prep, names, (int(shape[2]), int(shape[3]))
