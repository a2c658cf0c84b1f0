"""gluontl's own state on a block: one typed record per block instead of ad-hoc attributes.

The record rides on the block as one attribute, so ``copy.deepcopy`` (``copy_block``) copies it with the
block, as it copied the attributes it replaces. It is frozen: a change makes a new record, so a block
made from another (surgery, adapters) never shares a mutable one with it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from mxnet.gluon import Block

_ATTR = "_gluontl_state"


@dataclasses.dataclass(frozen=True)
class BlockState:
    # gluontl.onnx.importer.ImportInfo: what the importer knows of an imported graph (rules, surgery, export)
    onnx: Any = None
    # gluontl.adapters.Record: the LoRA adapters on the block and, for graphs, the graph without them
    lora: Any = None
    # detection models: the parameter names that came with the backbone's source (the guards read them)
    loaded: frozenset[str] | None = None


_EMPTY = BlockState()


def block_state(block: Block) -> BlockState:
    return getattr(block, _ATTR, _EMPTY)


def _put(block: Block, **changes: Any) -> None:
    setattr(block, _ATTR, dataclasses.replace(block_state(block), **changes))


def onnx_info(block: Block) -> Any:
    """The importer's record (``gluontl.onnx.importer.ImportInfo``) of a block imported from ONNX, else None."""
    return block_state(block).onnx


def set_onnx_info(block: Block, info: Any) -> None:
    _put(block, onnx=info)


def lora_record(block: Block) -> Any:
    """The adapters' record (``gluontl.adapters.Record``) of a block with LoRA adapters, else None."""
    return block_state(block).lora


def set_lora_record(block: Block, record: Any) -> None:
    """Set (or, with None, drop) the adapters' record."""
    _put(block, lora=record)


def loaded_names(block: Block) -> frozenset[str] | None:
    """The parameter names a detection model's backbone source gave it (None when not built so)."""
    return block_state(block).loaded


def set_loaded_names(block: Block, names: frozenset[str] | set[str]) -> None:
    _put(block, loaded=frozenset(names))
