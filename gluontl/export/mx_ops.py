"""MXNet→ONNX converters that ``mx.onnx`` (1.9.1) lacks or gets wrong, registered into its own
registry (a later registration for the same op and opset replaces mx.onnx's).

The ops are those our ONNX importer emits, so a model imported from ONNX, saved as a symbol
checkpoint and loaded as ``symbol:`` exports through mx.onnx again. Each converter is checked
against onnxruntime and numpy in tests/export/test_export_symbol_models.py.
"""
from __future__ import annotations

import numpy as np
import onnx
from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
from mxnet.onnx.mx2onnx._op_translations._op_translations_opset12 import (
    convert_string_to_list,
    create_basic_op_node,
    create_tensor,
    get_input_dtypes,
    get_inputs,
)
from onnx.helper import make_node

_INT64_MAX = np.iinfo(np.int64).max


def _flag(attrs: dict[str, str], key: str, default: bool) -> bool:
    """A boolean attribute as MXNet's JSON spells it ("True", "true", "1")."""
    return attrs.get(key, str(default)) in ("True", "true", "1")


def _register(op: str, *opsets: int):
    """Register for every opset mx.onnx has a converter of ``op`` at (it searches from the
    export opset down to 12, so overriding only opset 12 would leave its opset-13 one in use)."""
    def wrap(func):
        for opset in opsets or (12,):
            MXNetGraph.register(op, opset)(func)
        return func
    return wrap


@_register("erf")
def _erf(node, **kwargs):
    """Exact GELU in every transformer exported from PyTorch; mx.onnx has no ``erf``."""
    return create_basic_op_node("Erf", node, kwargs)


@_register("broadcast_maximum")
def _broadcast_maximum(node, **kwargs):
    """The importer's elementwise Max, tensor-bounded Clip and dilated max pooling; mx.onnx
    has ``broadcast_minimum`` but not its twin."""
    return create_basic_op_node("Max", node, kwargs)


@_register("_full")
def _full(node, **kwargs):
    """A constant (``ConstantOfShape`` of a static shape, e.g. RNN initial states); mx.onnx has
    no ``_full``. Returns its dtype, since the node has no input mx.onnx could take it from."""
    name, _, attrs = get_inputs(node, kwargs)
    dtype = np.dtype(attrs.get("dtype", "float32"))
    value = np.full(convert_string_to_list(attrs["shape"]), float(attrs.get("value", 0)), dtype=dtype)
    return [make_node("Constant", [], [name], name=name, value=onnx.numpy_helper.from_array(value))], [dtype]


@_register("_mod_scalar")
def _mod_scalar(node, **kwargs):
    """``x % scalar`` with the divisor's sign, like Python (and MXNet); mx.onnx has no ``_mod_scalar``.

    ONNX ``Mod`` has that sign rule for integers only; floats need ``fmod=1`` (the dividend's
    sign), so a nonzero remainder whose sign differs from the divisor's is shifted by it.
    """
    name, (x,), attrs = get_inputs(node, kwargs)
    dtype = np.dtype(get_input_dtypes(node, kwargs)[0])
    scalar = float(attrs["scalar"])
    if scalar == 0:  # MXNet's x % 0 is 0, even for inf and NaN
        return [make_node("Shape", [x], [name + "_shape"]),
                make_node("ConstantOfShape", [name + "_shape"], [name], name=name,
                          value=onnx.numpy_helper.from_array(np.zeros(1, dtype)))]
    create_tensor([scalar], name + "_divisor", kwargs["initializer"], dtype=dtype)
    if dtype.kind in "iu":
        return [make_node("Mod", [x, name + "_divisor"], [name], name=name)]
    create_tensor([0], name + "_zero", kwargs["initializer"], dtype=dtype)
    wrong_sign = "Less" if scalar > 0 else "Greater"
    return [
        make_node("Mod", [x, name + "_divisor"], [name + "_fmod"], fmod=1),
        make_node(wrong_sign, [name + "_fmod", name + "_zero"], [name + "_shift"]),
        make_node("Add", [name + "_fmod", name + "_divisor"], [name + "_shifted"]),
        make_node("Where", [name + "_shift", name + "_shifted", name + "_fmod"], [name], name=name),
    ]


@_register("broadcast_to")
def _broadcast_to(node, **kwargs):
    """mx.onnx copies a 0 of the target shape into ``Expand``, which then makes that axis
    empty; in MXNet 0 keeps the input's size, which is what 1 means to ``Expand``."""
    name, (x,), attrs = get_inputs(node, kwargs)
    shape = [d or 1 for d in convert_string_to_list(attrs["shape"])]
    create_tensor(shape, name + "_shape", kwargs["initializer"])
    return [make_node("Expand", [x, name + "_shape"], [name], name=name)]


@_register("_contrib_BilinearResize2D")
def _bilinear_resize(node, **kwargs):
    """mx.onnx writes ``align_corners`` coordinates whatever the op's ``align_corners`` says; the
    default (False) is ``pytorch_half_pixel``: (x + 0.5) * in / out - 0.5, clamped at 0. Mode
    ``like`` (the size of a second tensor: a segmentation head's logits brought to the input's size
    whatever it is, gluon-cv #1173) takes the sizes from that tensor's shape; mx.onnx has only ``size``."""
    name, inputs, attrs = get_inputs(node, kwargs)
    mode = attrs.get("mode", "size")
    if mode not in ("size", "like"):
        raise NotImplementedError(f"BilinearResize2D mode '{mode}' is not supported")
    corners = _flag(attrs, "align_corners", True)
    height, width = int(attrs.get("height", 0)), int(attrs.get("width", 0))
    init = kwargs["initializer"]
    create_tensor([], name + "_roi", init, dtype="float32")
    create_tensor([], name + "_scales", init, dtype="float32")
    create_tensor([0], name + "_0", init)
    create_tensor([2], name + "_2", init)
    create_tensor([4], name + "_4", init)
    nodes = [make_node("Shape", [inputs[0]], [name + "_shape"]),
             make_node("Slice", [name + "_shape", name + "_0", name + "_2"], [name + "_nc"])]
    if mode == "like":
        nodes += [make_node("Shape", [inputs[1]], [name + "_like_shape"]),
                  make_node("Slice", [name + "_like_shape", name + "_2", name + "_4"], [name + "_hw"])]
    elif height and width:
        create_tensor([height, width], name + "_hw", init)
    else:  # MXNet's size is int(size * scale), float32 product truncated, as Cast does
        create_tensor([float(attrs["scale_height"]), float(attrs["scale_width"])], name + "_hw_scale", init,
                      dtype="float32")
        create_tensor([_INT64_MAX], name + "_end", init)
        nodes += [make_node("Slice", [name + "_shape", name + "_2", name + "_end"], [name + "_in_hw"]),
                  make_node("Cast", [name + "_in_hw"], [name + "_in_hw_f"], to=onnx.TensorProto.FLOAT),
                  make_node("Mul", [name + "_in_hw_f", name + "_hw_scale"], [name + "_hw_f"]),
                  make_node("Cast", [name + "_hw_f"], [name + "_hw"], to=onnx.TensorProto.INT64)]
    return nodes + [
        make_node("Concat", [name + "_nc", name + "_hw"], [name + "_sizes"], axis=0),
        make_node("Resize", [inputs[0], name + "_roi", name + "_scales", name + "_sizes"], [name], name=name,
                  mode="linear",
                  coordinate_transformation_mode="align_corners" if corners else "pytorch_half_pixel"),
    ]


# mode: (ONNX op, MXNet gate order -> ONNX gate order)
_RNN_MODES = {"lstm": ("LSTM", [0, 3, 1, 2]),  # i f g o -> i o f c
              "gru": ("GRU", [1, 0, 2]),  # r z n -> z r h
              "rnn_tanh": ("RNN", [0]), "rnn_relu": ("RNN", [0])}


@_register("RNN", 12, 13)
def _rnn(node, **kwargs):
    """A fused MXNet RNN as one ONNX LSTM/GRU/RNN per layer.

    mx.onnx converts at most 2 layers, bidirectional only for a 1-layer LSTM (so not the
    bidirectional GRU of CRNN heads). MXNet packs all parameters into one vector: per layer
    and direction the input and recurrent weights, then per layer and direction both biases,
    gates in cuDNN order. Only the first layer's input size is unknown here, so its weights
    are cut from the front up to the statically-sized rest, counted from the end.
    """
    name, inputs, attrs = get_inputs(node, kwargs)
    mode = attrs["mode"]
    options = [k for k in ("use_sequence_length", "projection_size", "lstm_state_clip_min", "lstm_state_clip_max")
               if attrs.get(k, "None") not in ("None", "False", "0")]
    if options:
        raise NotImplementedError(f"RNN '{name}' uses {', '.join(options)}, which this export does not write")
    op, order = _RNN_MODES[mode]
    hidden, layers = int(attrs["state_size"]), int(attrs.get("num_layers", 1))
    dirs = 2 if _flag(attrs, "bidirectional", False) else 1
    gates = len(order) * hidden
    rows = np.concatenate([np.arange(g * hidden, (g + 1) * hidden) for g in order])
    init, nodes = kwargs["initializer"], []

    def const(suffix, values):
        create_tensor(values, f"{name}_{suffix}", init)
        return f"{name}_{suffix}"

    def add(op_type, ins, out, **attr):
        nodes.append(make_node(op_type, ins, [f"{name}_{out}"], **attr))
        return f"{name}_{out}"

    def cut(src, start, end, out, axis=0):
        return add("Slice", [src, const(f"{out}_from", [start]), const(f"{out}_to", [end]),
                             const(f"{out}_axis", [axis])], out)

    def gate_order(src, out, axis):
        return add("Gather", [src, const(f"{out}_rows", rows)], out, axis=axis)

    upper = dirs * gates * (dirs * hidden + hidden)  # weights of one layer above the first
    rest = (layers - 1) * upper + layers * dirs * 2 * gates
    first = cut(inputs[1], 0, -rest, "l0_weights")
    tail = cut(inputs[1], -rest, _INT64_MAX, "rest")
    x, last_h, last_c = inputs[0], [], []
    for layer in range(layers):
        chunk = first if layer == 0 else cut(tail, (layer - 1) * upper, layer * upper, f"l{layer}_weights")
        chunk = add("Reshape", [chunk, const(f"l{layer}_by_dir", [dirs, -1])], f"l{layer}_wr")
        w = cut(chunk, 0, -gates * hidden, f"l{layer}_w_flat", axis=1)
        r = cut(chunk, -gates * hidden, _INT64_MAX, f"l{layer}_r_flat", axis=1)
        w = add("Reshape", [w, const(f"l{layer}_w_shape", [dirs, gates, -1])], f"l{layer}_w_mx")
        r = add("Reshape", [r, const(f"l{layer}_r_shape", [dirs, gates, hidden])], f"l{layer}_r_mx")
        start = (layers - 1) * upper + layer * dirs * 2 * gates
        b = cut(tail, start, start + dirs * 2 * gates, f"l{layer}_b_flat")
        b = add("Reshape", [b, const(f"l{layer}_b_shape", [dirs, 2, gates])], f"l{layer}_b_mx")
        b = add("Reshape", [gate_order(b, f"l{layer}_b_g", 2), const(f"l{layer}_b_rows", [dirs, -1])],
                f"l{layer}_b")
        states = [cut(s, layer * dirs, (layer + 1) * dirs, f"l{layer}_s{i}")
                  for i, s in enumerate(inputs[2:4 if mode == "lstm" else 3])]
        outs = [f"{name}_l{layer}_{o}" for o in ("y", "h", "c")[:3 if mode == "lstm" else 2]]
        extra = {"linear_before_reset": 1} if op == "GRU" else {}
        if op == "RNN":
            extra = {"activations": ["Tanh" if mode == "rnn_tanh" else "Relu"] * dirs}
        nodes.append(make_node(op, [x, gate_order(w, f"l{layer}_w", 1), gate_order(r, f"l{layer}_r", 1), b, "",
                                    *states], outs, hidden_size=hidden,
                               direction="bidirectional" if dirs == 2 else "forward", **extra))
        y = add("Transpose", [outs[0]], f"l{layer}_y_t", perm=[0, 2, 1, 3])  # (T, N, dirs, H)
        x = add("Reshape", [y, const(f"l{layer}_y_shape", [0, 0, -1])], f"l{layer}_out")
        last_h.append(outs[1])
        last_c.extend(outs[2:])
    nodes.append(make_node("Identity", [x], [name], name=name))
    if _flag(attrs, "state_outputs", False):
        nodes.append(make_node("Concat", last_h, [name + "1"], axis=0))
        if mode == "lstm":
            nodes.append(make_node("Concat", last_c, [name + "2"], axis=0))
    return nodes
