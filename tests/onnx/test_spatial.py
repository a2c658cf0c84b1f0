"""An ONNX classifier bound at another image size than it declares, up to the nodes a dense head
reads (gluontl.onnx.spatial through sources.build_model): the features equal onnxruntime's float
run of the same file with its input dims changed, while what lies past them (a Flatten -> Gemm
made for the declared size) is cut off; a graph that is not fully convolutional up to the taps
is refused, naming the node."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import assert_f32_close, onnx_cut, ort_run, ort_session
from onnx import TensorProto, helper, numpy_helper

from gluontl.errors import GluontlError, OnnxImportError
from gluontl.naming import named_params
from gluontl.recipe import ModelSpec
from gluontl.sources import build_model
from gluontl.surgery import tap

DECLARED = 32


def _init(rng, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.normal(size=shape) * scale).astype(np.float32), name)


def classifier(path, *, middle: str = "plain") -> str:
    """A 32x32 classifier: conv (stride 2, explicit pads) -> BN -> Clip, a residual depthwise conv,
    max pool, a x2 Resize by scales, a channel Concat (tap 'cat'), a stride-2 conv (tap 'deep'),
    then Flatten -> Gemm over the 8x8 map, which holds the whole file to 32x32. ``middle``:
    'flatten' puts Flatten -> Gemm -> Reshape before 'deep', 'sizes' makes the Resize one to
    fixed sizes, 'bias' adds a constant of the map's own H x W."""
    rng = np.random.default_rng(7)
    inits = [_init(rng, "w1", 8, 3, 3, 3), _init(rng, "dw", 8, 1, 3, 3), _init(rng, "w2", 8, 16, 3, 3),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "g"),
             _init(rng, "b", 8), _init(rng, "m", 8, scale=0.1),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "v"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             _init(rng, "fc_w", 10, 8 * 8 * 8, scale=0.05), _init(rng, "fc_b", 10)]
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], name="stem", strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="stem.bn"),
             helper.make_node("Clip", ["bn", "lo", "hi"], ["act"], name="stem.relu6"),
             helper.make_node("Conv", ["act", "dw"], ["dwo"], name="dw", group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["act", "dwo"], ["res"], name="res"),
             helper.make_node("MaxPool", ["res"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    if middle == "sizes":
        inits.append(numpy_helper.from_array(np.array([1, 8, 16, 16], np.int64), "sizes"))
        nodes.append(helper.make_node("Resize", ["pool", "", "", "sizes"], ["up"], name="up", mode="nearest"))
    else:
        nodes.append(helper.make_node("Resize", ["pool", "", "scales"], ["up"], name="up", mode="nearest"))
    nodes.append(helper.make_node("Concat", ["up", "res"], ["cat"], name="cat", axis=1))
    head = "cat"
    if middle == "flatten":
        inits += [_init(rng, "mid_w", 16 * 16 * 16, 16 * 16 * 16, scale=0.01),
                  numpy_helper.from_array(np.array([1, 16, 16, 16], np.int64), "mid_shape")]
        nodes += [helper.make_node("Flatten", ["cat"], ["flat0"], name="squash"),
                  helper.make_node("Gemm", ["flat0", "mid_w"], ["mid"], name="mix"),
                  helper.make_node("Reshape", ["mid", "mid_shape"], ["mid4"], name="unsquash")]
        head = "mid4"
    if middle == "bias":
        inits.append(_init(rng, "pos", 1, 16, 16, 16))
        nodes.append(helper.make_node("Add", ["cat", "pos"], ["posed"], name="posed"))
        head = "posed"
    nodes += [helper.make_node("Conv", [head, "w2"], ["deep"], name="deep", strides=[2, 2], pads=[1, 1, 1, 1]),
              helper.make_node("Flatten", ["deep"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info(
        "input", TensorProto.FLOAT, ["N", 3, DECLARED, DECLARED])], [helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return f"onnx:{path}"


def ort_features(path: str, hw: tuple[int, int], taps: list[str], x: np.ndarray) -> list[np.ndarray]:
    """onnxruntime (float kernels, basic rewrites) on the file with its input's H, W set to ``hw``,
    cut at ``taps`` by onnx's own extractor (onnxruntime would refuse the Gemm past them)."""
    model = onnx.load(path)
    for d, size in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], hw):
        d.Clear()
        d.dim_value = size
    return ort_session(onnx_cut(model, ["input"], taps)).run(taps, {"input": x})


@pytest.mark.parametrize("hw", [(48, 40), (16, 64), (DECLARED, DECLARED)])
def test_bound_up_to_the_taps_the_features_equal_onnxruntime_at_that_size(hw, tmp_path):
    source = classifier(tmp_path / "c.onnx")
    taps = ["cat", "deep"]
    net, _ = build_model(ModelSpec(source=source, input_shape=(3, *hw)), ends=taps)
    x = np.random.default_rng(1).normal(size=(2, 3, *hw)).astype(np.float32)
    with mx.autograd.predict_mode():
        got = [f.asnumpy() for f in tap(net, taps)(mx.nd.array(x))]
    want = ort_features(source[5:], hw, taps, x)
    for g, w, name in zip(got, want, taps):
        assert g.shape == w.shape == (2, 16 if name == "cat" else 8, hw[0] // (2 if name == "cat" else 4),
                                      hw[1] // (2 if name == "cat" else 4))
        assert_f32_close(g, w, terms=16 * 9, depth=3, err_msg=name)
    names = set(named_params(net))
    if hw == (DECLARED, DECLARED):  # the size the file declares: imported whole, as always
        assert {"fc_w", "fc_b"} <= names
    else:  # cut after the taps: the Gemm made for 8x8 maps is neither imported nor computed
        assert "fc_w" not in names and {"w1", "dw", "w2"} <= names


@pytest.mark.parametrize("middle, node, op", [("flatten", "squash", "Flatten"), ("sizes", "up", "Resize"),
                                              ("bias", "posed", "Add")])
def test_a_graph_not_fully_convolutional_up_to_the_taps_is_refused_naming_the_node(middle, node, op, tmp_path):
    source = classifier(tmp_path / "c.onnx", middle=middle)
    with pytest.raises(OnnxImportError) as err:
        build_model(ModelSpec(source=source, input_shape=(3, 48, 48)), ends=["deep"])
    text = str(err.value)
    assert f"node '{node}' ({op})" in text and "48x48" in text and "model.input_shape" in text, text
    assert isinstance(err.value, GluontlError)  # the CLI: one paragraph, exit code 2
    # before the refused node the graph is convolutional: bound there, it runs at 48x48
    net, _ = build_model(ModelSpec(source=source, input_shape=(3, 48, 48)), ends=["res"])
    with mx.autograd.predict_mode():
        assert tap(net, ["res"])(mx.nd.zeros((1, 3, 48, 48))).shape == (1, 8, 24, 24)


def test_without_taps_another_size_is_refused_as_before(tmp_path):
    source = classifier(tmp_path / "c.onnx")
    with pytest.raises(GluontlError, match="model.input_shape"):
        build_model(ModelSpec(source=source, input_shape=(3, 48, 48)))


def test_a_tap_that_is_no_node_is_named(tmp_path):
    source = classifier(tmp_path / "c.onnx")
    with pytest.raises(OnnxImportError, match="no node or tensor 'blocks.9'"):
        build_model(ModelSpec(source=source, input_shape=(3, 48, 48)), ends=["blocks.9"])


def _seg_recipe(folder, source: str, taps: list[str]):
    """A segmentation recipe at 48x48 on ``source`` with an images/ + masks/ folder of 4 pairs."""
    from PIL import Image

    from gluontl.segment.formats import write_mask

    for sub in ("images", "masks"):
        (folder / sub).mkdir()
    rng = np.random.default_rng(0)
    for k in range(4):
        Image.fromarray(rng.integers(0, 255, (48, 48, 3)).astype(np.uint8)).save(folder / "images" / f"{k}.png")
        write_mask(folder / "masks" / f"{k}.png", rng.integers(0, 2, (48, 48)).astype(np.uint8))
    recipe = folder / "seg.yaml"
    recipe.write_text(
        f"name: seg\ntask: segmentation\nmodel: {{source: '{source}', input_shape: [3, 48, 48]}}\n"
        f"segmentation: {{arch: lraspp, taps: {taps}, head_channels: 8}}\n"
        f"data: {{source: 'masks:{folder}', classes: [background, thing]}}\n")
    return str(recipe)


def test_the_plan_says_the_backbone_is_bound_at_another_size_and_a_refusal_exits_2(tmp_path, capsys):
    from tests.helpers import run_cli

    good = _seg_recipe(tmp_path, classifier(tmp_path / "c.onnx"), ["cat", "deep"])
    code, out, err = run_cli(capsys, "plan", "--recipe", good)
    assert code == 0, err
    assert "declares 32x32; bound at 48x48 up to the taps" in out
    (tmp_path / "bad").mkdir()
    bad = _seg_recipe(tmp_path / "bad", classifier(tmp_path / "f.onnx", middle="flatten"), ["cat", "deep"])
    code, out, err = run_cli(capsys, "plan", "--recipe", bad)
    assert code == 2 and "Traceback" not in err
    assert "node 'squash' (Flatten)" in " ".join(err.split()), err
    assert err.startswith("error: ") and err.count("error:") == 1 and "\n\n" not in err.strip()  # one paragraph


def test_a_classifier_file_restores_into_a_backbone_bound_at_another_size(tmp_path):
    """restore.type: classification from the classifier's own file (its Gemm past the taps
    included): the backbone takes the file's values, and the cut-off names are not 'unexpected'."""
    from gluontl.segment.models import SegmenterSpec, build_segmenter
    from gluontl.sources.restore import snapshot
    from gluontl.data.checkpoint import save_params

    source = classifier(tmp_path / "c.onnx")
    whole, _ = build_model(ModelSpec(source=source, input_shape=(3, DECLARED, DECLARED)))
    rng = np.random.default_rng(2)
    for e in named_params(whole).values():
        e.param.set_data(mx.nd.array(rng.normal(size=e.param.data().shape).astype(np.float32)))
    save_params(whole, tmp_path / "cls.params")
    file = snapshot(whole)
    spec = ModelSpec(source=source, input_shape=(3, 48, 48), weights=str(tmp_path / "cls.params"),
                     restore={"type": "classification"})
    net, report = build_segmenter(spec, SegmenterSpec("lraspp", taps=("cat", "deep"), head_channels=8), 3)
    got = snapshot(net)
    backbone = {n[len("backbone."):] for n in got if n.startswith("backbone.")}
    assert backbone and "fc_w" not in backbone
    assert all(np.array_equal(got[f"backbone.{n}"], file[n]) for n in backbone)
    assert not report.unexpected and not report.missing


def test_a_segmenter_on_a_backbone_bound_at_another_size_exports_to_onnx_that_matches(tmp_path):
    """export_segmenter writes the file only when onnxruntime reproduces MXNet on the samples; the
    logits of the written file are compared here once more, at the bound size."""
    from gluontl.segment.export import export_segmenter
    from gluontl.segment.models import SegmenterSpec, build_segmenter

    mx.random.seed(4)
    net, _ = build_segmenter(ModelSpec(source=classifier(tmp_path / "c.onnx"), input_shape=(3, 48, 48)),
                             SegmenterSpec("lraspp", taps=("cat", "deep"), head_channels=8), 3)
    x = np.random.default_rng(5).normal(size=(4, 3, 48, 48)).astype(np.float32)
    [path] = export_segmenter(net, tmp_path / "out", "seg", (3, 48, 48), formats=["onnx"], sample=x)
    with mx.autograd.predict_mode():
        logits = net(mx.nd.array(x)).asnumpy()
    got_logits, _ = ort_run(path, x)
    assert_f32_close(got_logits, logits, terms=16 * 9, depth=5)
