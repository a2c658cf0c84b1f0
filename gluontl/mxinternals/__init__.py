"""The one door to MXNet's internals: nothing else in gluontl names a Gluon private attribute,
parses ``Symbol.tojson()`` or carries state on a block (``tests/test_layers.py`` holds this).

- ``symjson``: symbol JSON read and written (non-ASCII names kept: MXNet reads no ``\\u`` escapes);
- ``blocks``: a block's graph, children, parameters and op arguments; cached ops and when to clear them;
  BatchNorm mode inside a graph;
- ``loaders``: the dataset behind a DataLoader;
- ``gluoncv``: an SSD anchor generator's geometry (GluonCV's private fields);
- ``trainer``: the Trainer's lazy kvstore set-up and the optimizer's state, for checkpoints and broadcasts;
- ``state``: gluontl's typed per-block record (ONNX import, LoRA adapters, a detector's loaded names);
- ``graphblock``: SymbolBlocks whose parameters save and load under their graph names, and whose
  large graphs skip MXNet's cubic common-subexpression pass;
- ``plain_grad``: the copy before a convolution that a reshape feeds (oneDNN-blocked gradients, issue 23).

Each MXNet behaviour a function relies on or works around is a test in tests/test_platform_facts.py.
"""
from .blocks import (CONV_BASE, RNN_BASE, cached_graph, cached_symbol, children, clear_cached_op, clear_cached_ops,
                     collect_params_by_path, conv_op_name, copy_block, dense_args, is_differentiable, is_hybridized,
                     op_kwargs, own_params, param_shape, param_table, put_param, remove_child, replace_cached_graph,
                     set_graph_bn_modes, set_op_kwarg, set_own_params)
from .gluoncv import ssd_anchor_geometry, ssd_anchors
from .loaders import loader_dataset
from .state import (BlockState, block_state, loaded_names, lora_record, onnx_info, set_loaded_names,
                    set_lora_record, set_onnx_info)
from .symjson import graph_of, nodes_of, symbol_from, symbol_json
from .trainer import (count_update, init_trainer, set_update_counts, trainer_optimizer, trainer_params, trainer_updaters,
                      update_counts)

__all__ = [
    "CONV_BASE", "RNN_BASE", "conv_op_name", "dense_args", "is_differentiable", "loader_dataset",
    "ssd_anchor_geometry", "ssd_anchors", "BlockState", "block_state", "cached_graph", "cached_symbol", "children", "clear_cached_op", "clear_cached_ops",
    "collect_params_by_path", "copy_block", "count_update", "graph_of", "init_trainer", "is_hybridized", "loaded_names",
    "lora_record", "nodes_of", "onnx_info", "op_kwargs", "own_params", "param_shape", "param_table", "put_param",
    "remove_child", "replace_cached_graph", "set_graph_bn_modes", "set_loaded_names", "set_lora_record",
    "set_onnx_info", "set_op_kwarg", "set_own_params", "set_update_counts", "symbol_from", "symbol_json",
    "trainer_optimizer", "trainer_params", "trainer_updaters", "update_counts",
]
