"""Symbol JSON, read and written: the only place gluontl parses ``Symbol.tojson()`` or builds a symbol from JSON.

MXNet's JSON reader (dmlc-core's ``json.h``) takes UTF-8 text and the escapes ``\\"``, ``\\\\``, ``\\t``,
``\\n``..., but no ``\\uXXXX`` escape ("unknown string escape"): Python's ``json.dumps`` writes one for every
non-ASCII character by default, so a graph with a layer named ``conv_é`` would not load back. Writes
here keep non-ASCII characters as they are (tests/test_platform_facts.py holds both facts).
"""
from __future__ import annotations

import json
from typing import Any

import mxnet as mx


def graph_of(sym: mx.sym.Symbol) -> dict[str, Any]:
    """The symbol's JSON graph: ``nodes`` (topological order: inputs first), ``arg_nodes``, ``heads``."""
    return json.loads(sym.tojson())


def nodes_of(sym: mx.sym.Symbol) -> list[dict[str, Any]]:
    """The symbol's nodes: ``op`` (``"null"`` for a variable), ``name``, ``attrs``, ``inputs`` as
    ``[node index, output index, version]``."""
    return graph_of(sym)["nodes"]


def symbol_json(graph: dict[str, Any]) -> str:
    """``graph`` as JSON text MXNet reads back: non-ASCII characters kept, never ``\\u``-escaped."""
    return json.dumps(graph, ensure_ascii=False)


def symbol_from(graph: dict[str, Any]) -> mx.sym.Symbol:
    """The symbol of an (edited) JSON graph; ``node_row_ptr`` may be left out, MXNet recomputes it."""
    return mx.sym.load_json(symbol_json(graph))
