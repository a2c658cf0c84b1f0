"""Segmenters (gluontl.segment.models): every arch on zoo, symbol and ONNX sources gives logits at
the input's size for sizes that are and are not multiples of the output stride (gluon-cv #1173,
pinned upstream), the final resize against a numpy half-pixel bilinear, the aux output in
training mode only, structural parameter names and stages, and restore: classification (the
backbone only) and segmentation (everything), a changed class count rebuilding the class rows
from ``reuse`` (gluon-cv #969), each compared bit for bit.

Small models: ResNet-18 and MobileNetV2-0.25 classifiers, tiny symbol/ONNX conv nets, 64 px;
GluonCV's own heads need ResNet-50 (2048 channels), built once per arch.
"""
from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from tests.helpers import assert_f32_close, tiny_symbol

from gluontl.errors import ModelSourceError, RestoreError, SurgeryError
from gluontl.export.exporters import export_block
from gluontl.naming import named_params
from gluontl.recipe import ModelSpec
from gluontl.rules import apply_plan, make_plan, trainable_params
from gluontl.segment.loss import SegmentationLoss
from gluontl.segment.models import SegmenterSpec, Segmenter, bilinear_matmul, build_segmenter
from gluontl.sources.restore import snapshot
from gluontl.stages import stage_map
from gluontl.data import checkpoint
from gluontl.data.checkpoint import save_params

SIZES = [(64, 64), (48, 80), (61, 75)]  # a multiple of 32; of 16 only; of nothing


def tiny_onnx(folder) -> str:
    """A BN conv net with strides 2, 4, 8 exported to ONNX (an ``onnx:`` source)."""
    mx.random.seed(3)
    net = mx.gluon.nn.HybridSequential()
    for width in (8, 16, 24):
        net.add(mx.gluon.nn.Conv2D(width, 3, strides=2, padding=1), mx.gluon.nn.BatchNorm(),
                mx.gluon.nn.Activation("relu"))
    net.add(mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    export_block(net, folder, "tiny", {"data": (1, 3, 64, 64)}, formats=["onnx"])
    return f"onnx:{folder / 'tiny.onnx'}"


def source(kind: str, tmp_path) -> ModelSpec:
    if kind == "symbol":
        return ModelSpec(source=f"symbol:{tiny_symbol(tmp_path)}", input_shape=(3, 16, 16))
    if kind == "onnx":
        return ModelSpec(source=tiny_onnx(tmp_path), input_shape=(3, 64, 64))
    return ModelSpec(source=kind, input_shape=(3, 64, 64))


CASES = [("zoo:resnet18_v1", "fcn", True), ("zoo:mobilenetv2_0.25", "lraspp", False), ("symbol", "fcn", True),
         ("onnx", "lraspp", True), ("onnx", "fcn", False), ("zoo:fcn_resnet50_voc", "fcn", True),
         ("zoo:resnet50_v1s", "psp", True), ("zoo:resnet50_v1s", "deeplab", False)]


@pytest.mark.parametrize("kind, arch, aux", CASES, ids=[f"{a}-{k}{'-aux' if x else ''}" for k, a, x in CASES])
def test_logits_at_the_input_size_in_predict_mode_and_aux_in_training(kind, arch, aux, tmp_path):
    net, report = build_segmenter(source(kind, tmp_path), SegmenterSpec(arch, aux=aux, head_channels=8), 5)
    assert report is None
    for hybrid in (False, True):
        net.hybridize(hybrid)
        for h, w in SIZES:
            x = mx.nd.array(np.random.default_rng(h).normal(size=(2, 3, h, w)))
            with mx.autograd.predict_mode():
                out = net(x)
            assert out.shape == (2, 5, h, w), (hybrid, h, w)
            with mx.autograd.record():
                train = net(x)
            shapes = [t.shape for t in train] if isinstance(train, (list, tuple)) else [train.shape]
            assert shapes == [(2, 5, h, w)] * (2 if aux else 1), (hybrid, h, w)
            assert np.isfinite(out.asnumpy()).all()


def _bilinear_half_pixel(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """(N, C, h0, w0) -> (N, C, h, w) bilinear with half-pixel centres, source coordinates clamped
    at 0 and the last row/column repeated (PyTorch's align_corners=False), in float64."""
    def axis(n_in, n_out):
        src = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0.0)
        i0 = np.floor(src).astype(int)
        return i0, np.minimum(i0 + 1, n_in - 1), src - i0
    y0, y1, fy = axis(x.shape[2], h)
    x0, x1, fx = axis(x.shape[3], w)
    x = x.astype(np.float64)
    top = x[:, :, y0][..., x0] * (1 - fx) + x[:, :, y0][..., x1] * fx
    bottom = x[:, :, y1][..., x0] * (1 - fx) + x[:, :, y1][..., x1] * fx
    return top * (1 - fy[:, None]) + bottom * fy[:, None]


@pytest.mark.parametrize("hw", SIZES)
def test_logits_are_the_heads_output_resized_half_pixel_to_the_input(hw):
    """An input of 61 x 75 gives a 2 x 3 stride-32 map; its logits must cover the image as the map
    does (pixel centres), not a crop_size or a size rounded to the stride."""
    net, _ = build_segmenter(ModelSpec(source="zoo:resnet18_v1", input_shape=(3, 64, 64)),
                             SegmenterSpec("fcn", head_channels=8), 4)
    x = mx.nd.array(np.random.default_rng(1).normal(size=(2, 3, *hw)))
    with mx.autograd.predict_mode():
        small = net.head(net.backbone(x)).asnumpy()
        out = net(x).asnumpy()
    assert small.shape[2:] == tuple(-(-d // 32) for d in hw)
    assert_f32_close(out, _bilinear_half_pixel(small, *hw), terms=4)


def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64 matrix of the half-pixel resize along one axis (the reference above)."""
    return _bilinear_half_pixel(np.eye(n_in)[None, None], n_out, n_in)[0, 0]  # the identity's rows resized


RESIZES = [(16, 16, 128, 128), (5, 7, 61, 75), (8, 8, 4, 4), (3, 5, 3, 5), (1, 1, 4, 6), (24, 20, 192, 160)]


@pytest.mark.parametrize("h0, w0, h, w", RESIZES, ids=[f"{a}x{b}-{c}x{d}" for a, b, c, d in RESIZES])
@pytest.mark.parametrize("hybrid", [False, True])
def test_the_training_resize_is_the_half_pixel_bilinear_forward_and_backward(h0, w0, h, w, hybrid):
    """``bilinear_matmul`` (training graphs' resize) against float64 numpy: the forward, and the
    gradient, which is the adjoint A_h^T g A_w of the resize y = A_h x A_w^T."""
    class Up(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, like):
            return bilinear_matmul(F, x, like)

    rng = np.random.default_rng(h0 * 100 + w)
    x0 = rng.normal(size=(2, 3, h0, w0)).astype(np.float32)
    g = rng.normal(size=(2, 3, h, w)).astype(np.float32)
    up = Up()
    up.hybridize(hybrid)
    x = mx.nd.array(x0)
    x.attach_grad()
    with mx.autograd.record():
        y = up(x, mx.nd.zeros((2, 3, h, w)))
    y.backward(mx.nd.array(g))
    assert_f32_close(y.asnumpy(), _bilinear_half_pixel(x0, h, w), terms=4)
    a_h, a_w = _bilinear_matrix(h0, h), _bilinear_matrix(w0, w)
    want = np.einsum("ih,nciw,wj->nchj", a_h, g.astype(np.float64), a_w)
    assert_f32_close(x.grad.asnumpy(), want, terms=-(-h // h0) * -(-w // w0) * 4)


def test_the_training_graph_resizes_by_matrices_and_the_predict_graph_by_bilinearresize2d():
    """Training-mode logits are the head's resized (a 61 x 75 input, not a multiple of the stride),
    and switching modes rebuilds the cached graph: the predict graph, which exports read, holds
    BilinearResize2D and no dot."""
    net, _ = build_segmenter(ModelSpec(source="zoo:mobilenetv2_0.25", input_shape=(3, 64, 64)),
                             SegmenterSpec("lraspp", head_channels=8), 4)
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.default_rng(2).normal(size=(2, 3, 61, 75)))
    with mx.autograd.train_mode():  # no backward: the BatchNorm statistics stay
        feats = net.backbone(x)
        small = net.head(feats[0], feats[-1]).asnumpy()
        train = net(x).asnumpy()
    ops = {n["op"] for n in json.loads(net._cached_graph[1].tojson())["nodes"]}
    assert "dot" in ops and "_contrib_BilinearResize2D" not in ops
    assert_f32_close(train, _bilinear_half_pixel(small, 61, 75), terms=4)
    with mx.autograd.predict_mode():
        net(x)
    ops = {n["op"] for n in json.loads(net._cached_graph[1].tojson())["nodes"]}
    assert "_contrib_BilinearResize2D" in ops and "dot" not in ops


def test_gluoncv_fcn_answers_at_crop_size_and_psp_fails_off_the_stride_ours_at_the_input_size():
    """gluon-cv #1173, pinned upstream: GluonCV resizes to crop_size (FCN: 64 x 64 logits for a
    61 x 75 image) and pools PSP branches to crop_size // 8 (a 61 x 75 image's 8 x 10 map does not
    concatenate with them)."""
    from gluoncv.model_zoo import FCN, PSPNet

    x = mx.nd.array(np.random.default_rng(0).normal(size=(1, 3, 61, 75)))
    fcn = FCN(5, backbone="resnet50", aux=False, pretrained_base=False, crop_size=64)
    fcn.initialize()
    with mx.autograd.predict_mode():
        assert fcn(x)[0].shape == (1, 5, 64, 64)
    psp = PSPNet(5, backbone="resnet50", aux=False, pretrained_base=False, crop_size=64)
    psp.initialize()
    with pytest.raises(mx.base.MXNetError), mx.autograd.predict_mode():
        psp(x)[0].wait_to_read()
    ours, _ = build_segmenter(ModelSpec(source="zoo:resnet50_v1s", input_shape=(3, 64, 64)), SegmenterSpec("psp"), 5)
    with mx.autograd.predict_mode():
        assert ours(x).shape == (1, 5, 61, 75)


def test_aux_logits_are_the_aux_head_on_the_first_tap_and_predict_mode_returns_logits_only():
    net, _ = build_segmenter(ModelSpec(source="zoo:resnet18_v1", input_shape=(3, 64, 64)),
                             SegmenterSpec("fcn", aux=True, head_channels=8), 3)
    net.hybridize()
    x = mx.nd.array(np.random.default_rng(2).normal(size=(2, 3, 48, 80)))
    for d in (net.head.block[3], net.aux.block[3]):  # dropout is random in training: compare without it
        d._rate = 0.0
    with mx.autograd.train_mode():
        out, aux = net(x)
        feats = net.backbone(x)
        want = net.aux(feats[0]).asnumpy()
        assert feats[0].shape[2] > feats[-1].shape[2]  # the aux head reads the shallower tap
    assert_f32_close(aux.asnumpy(), _bilinear_half_pixel(want, 48, 80), terms=4)
    with mx.autograd.predict_mode():
        again = net(x)
    assert isinstance(again, mx.nd.NDArray) and again.shape == (2, 3, 48, 80)


def test_parameter_names_are_structural_and_stages_number_the_backbone():
    spec = ModelSpec(source="zoo:resnet50_v1s", input_shape=(3, 64, 64))
    a, _ = build_segmenter(spec, SegmenterSpec("deeplab", aux=True), 4)
    b, _ = build_segmenter(spec, SegmenterSpec("deeplab", aux=True), 4)  # a second net in this process
    names = list(named_params(a))
    assert names == list(named_params(b))
    assert {n.split(".", 1)[0] for n in names} == {"backbone", "head", "aux"}
    for n in ("backbone.conv1.0.weight", "backbone.layer4.2.conv3.weight", "head.aspp.concurent.4.gap.1.weight",
              "head.block.4.weight", "aux.block.4.bias"):
        assert n in names
    stages = stage_map(a, (3, 64, 64))
    assert stages["backbone.conv1.0.weight"] == "stem" and stages["backbone.layer2.0.conv1.weight"] == 2
    assert stages["backbone.layer4.0.conv1.weight"] == 4  # dilated: stride 8, still stage 4
    assert {stages[n] for n in names if not n.startswith("backbone.")} == {"head"}


def test_stages_of_an_onnx_backbone_follow_the_stride_and_rules_select_by_them(tmp_path):
    spec = source("onnx", tmp_path)
    net, _ = build_segmenter(spec, SegmenterSpec("lraspp", head_channels=8), 3)
    stages = stage_map(net, (3, 64, 64))
    backbone = sorted({v for n, v in stages.items() if n.startswith("backbone.")}, key=str)
    assert backbone == [1, 2, "stem"]  # strides 2, 4, 8
    plan = make_plan(net, [{"stage": ["stem", 1], "grad_req": "null"}], input_shape=(3, 64, 64))
    for r in plan.rows:
        statistic = r.name.endswith(("running_mean", "running_var"))  # never trained by gradients
        assert r.trainable == (stages[r.name] not in ("stem", 1) and not statistic), r.name


def test_training_through_a_plan_leaves_frozen_stages_and_statistics_bit_identical():
    """freeze_until_stage 2 (BN statistics frozen too) on a hybridized segmenter with an aux head,
    two SGD steps of the segmentation loss: stem..2 unchanged, stages 3, 4 and the heads trained."""
    net, _ = build_segmenter(ZOO, SEG, 3)
    plan = make_plan(net, [{"preset": "freeze_until_stage", "until_stage": 2}], input_shape=(3, 64, 64))
    apply_plan(net, plan)
    net.hybridize()
    before = snapshot(net)
    trainer = mx.gluon.Trainer(list(trainable_params(net).values()), "sgd", {"learning_rate": 0.1})
    loss_fn = SegmentationLoss(aux_weight=0.4)
    rng = np.random.default_rng(4)
    for _ in range(2):
        x, y = mx.nd.array(rng.normal(size=(2, 3, 64, 64))), mx.nd.array(rng.integers(0, 3, (2, 64, 64)))
        with mx.autograd.record():
            loss = loss_fn(*net(x), y)
        loss.backward()
        trainer.step(2)
    after, stages = snapshot(net), stage_map(net, (3, 64, 64))
    for n in before:
        frozen = stages[n] in ("stem", 1, 2)
        assert np.array_equal(before[n], after[n]) == frozen, n


def test_taps_are_checked_against_the_source_with_close_names(tmp_path):
    spec = ModelSpec(source="zoo:resnet18_v1", input_shape=(3, 64, 64))
    with pytest.raises(SurgeryError, match=r"segmentation.taps names 'features.44'.*close"):
        build_segmenter(spec, SegmenterSpec("fcn", taps=("features.44",)), 3)
    with pytest.raises(ModelSourceError, match="lraspp reads a shallow and a deep map: give 2"):
        build_segmenter(spec, SegmenterSpec("lraspp", taps=("features.7",)), 3)
    with pytest.raises(SurgeryError, match="shallow to deep"):
        build_segmenter(spec, SegmenterSpec("lraspp", taps=("features.7", "features.6")), 3)
    with pytest.raises(ModelSourceError, match="GluonCV's head on its dilated ResNets"):
        build_segmenter(spec, SegmenterSpec("psp"), 3)
    with pytest.raises(ModelSourceError, match="arch"):
        SegmenterSpec("unet")


# ---------------------------------------------------------------------------------- restore

ZOO = ModelSpec(source="zoo:resnet18_v1", input_shape=(3, 64, 64))
SEG = SegmenterSpec("fcn", aux=True, head_channels=8)
CLASS_LAYERS = ("head.block.4", "aux.block.4")  # GluonCV's _FCNHead: the last conv maps to classes


def _build(spec: ModelSpec, classes: int, seed: int = 0, **update):
    mx.random.seed(seed)  # fresh initialization the same in every call
    return build_segmenter(spec.model_copy(update=update), SEG, classes)


def _marked(classes: int, path, seed: int) -> dict[str, np.ndarray]:
    """A segmenter file with known values: class layer k's row r is 1000 k + r, the rest normals."""
    net = _marked_net(classes, seed)
    save_params(net, path)
    return snapshot(net)


def _marked_net(classes: int, seed: int) -> Segmenter:
    net, _ = _build(ZOO, classes)
    rng = np.random.default_rng(seed)
    for n, e in named_params(net).items():
        shape = e.param.data().shape
        layer = n.rsplit(".", 1)[0]
        if layer in CLASS_LAYERS:
            k = CLASS_LAYERS.index(layer) + 1
            value = np.broadcast_to((1000.0 * k + np.arange(shape[0])).reshape((-1,) + (1,) * (len(shape) - 1)), shape)
        else:
            value = rng.standard_normal(shape)
        e.param.set_data(mx.nd.array(value.astype(np.float32)))
    return net


def test_segmentation_restore_with_the_same_classes_is_bit_identical(tmp_path):
    old = _marked(3, tmp_path / "seg.params", seed=1)
    net, report = _build(ZOO, 3, weights=str(tmp_path / "seg.params"))
    got = snapshot(net)
    assert set(got) == set(old) and all(np.array_equal(got[n], old[n]) for n in old)
    assert len(report.restored) == len(old) and not (report.missing or report.unexpected or report.rebuilt)


@pytest.mark.parametrize("reuse, rows", [({"3": "0", "1": "2"}, {3: 0, 1: 2}), ({}, {})], ids=["reuse", "none"])
def test_a_changed_class_count_rebuilds_class_rows_from_reuse_and_restores_the_rest(reuse, rows, tmp_path):
    """gluon-cv #969: 3 old classes, 4 new. Listed new classes take their old class's rows; the
    others keep the fresh initialization (the same seeded build without weights); every other
    parameter is the file's."""
    old = _marked(3, tmp_path / "seg.params", seed=1)
    fresh = snapshot(_build(ZOO, 4)[0])
    net, report = _build(ZOO, 4, weights=str(tmp_path / "seg.params"),
                         restore=ZOO.restore.model_copy(update={"reuse": reuse}))
    got = snapshot(net)
    for n, value in got.items():
        if n.rsplit(".", 1)[0] not in CLASS_LAYERS:
            assert np.array_equal(value, old[n]), n
            continue
        for r in range(4):
            want = old[n][rows[r]] if r in rows else fresh[n][r]
            assert np.array_equal(value[r], want), (n, r)
    assert sorted(n for n, _ in report.rebuilt) == sorted(f"{c}.{w}" for c in CLASS_LAYERS for w in ("weight", "bias"))
    assert not (report.missing or report.mismatched or report.unexpected)


def test_reuse_by_name_reads_the_old_class_names_from_the_run_folder(tmp_path):
    """A run folder as finetune leaves it: recipe.yaml, preprocess.json naming the classes, a
    hash-checked best checkpoint."""
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    marked = _marked_net(3, seed=2)
    old = snapshot(marked)
    trainer = mx.gluon.Trainer(marked.collect_params(), "sgd", {"learning_rate": 0.1})
    checkpoint.save(run / "checkpoints", "best", marked, trainer, {"epoch": 1})
    (run / "recipe.yaml").write_text("name: old\n", encoding="utf-8")
    (run / "preprocess.json").write_text(json.dumps({"classes": ["bg", "cat", "dog"], "preprocess": {}}))
    mx.random.seed(0)
    net, report = build_segmenter(ZOO.model_copy(update={"weights": str(run),
                                                         "restore": ZOO.restore.model_copy(update={"reuse": {"puppy": "dog"}})}),
                                  SEG, 2, class_names=["bg", "puppy"])
    got = snapshot(net)
    assert np.array_equal(got["head.block.4.weight"][1], old["head.block.4.weight"][2])
    assert any("puppy<-dog" in how for _, how in report.rebuilt)


def test_classification_restores_the_backbone_only_and_leaves_the_heads_at_init(tmp_path):
    mx.random.seed(5)
    classifier = mx.gluon.model_zoo.vision.get_model("resnet18_v1", classes=7)
    classifier.initialize(mx.init.Normal(0.5))
    classifier(mx.nd.zeros((1, 3, 64, 64)))
    save_params(classifier, tmp_path / "cls.params")
    file = snapshot(classifier)
    fresh = snapshot(_build(ZOO, 3)[0])
    net, report = _build(ZOO, 3, weights=str(tmp_path / "cls.params"),
                         restore=ZOO.restore.model_copy(update={"type": "classification"}))
    got = snapshot(net)
    for n, value in got.items():
        if n.startswith("backbone."):
            assert np.array_equal(value, file[n[len("backbone."):]]), n
        else:
            assert np.array_equal(value, fresh[n]), n
    assert all(n.startswith("backbone.") for n in report.restored) and not report.unexpected  # output.* left out
    with pytest.raises(RestoreError, match="backbone but no head: if it is a classifier's, set model.restore.type: "
                                           "classification"):
        _build(ZOO, 3, weights=str(tmp_path / "cls.params"))  # restore.type segmentation, the default


def test_refused_restores_name_the_problem(tmp_path):
    _marked(3, tmp_path / "seg.params", seed=1)
    weights = str(tmp_path / "seg.params")
    with pytest.raises(RestoreError, match="only restore.type: segmentation reads"):
        _build(ZOO, 3, weights=weights, restore=ZOO.restore.model_copy(update={"type": "classification",
                                                                             "reuse": {"0": "1"}}))
    with pytest.raises(RestoreError, match="restore.type is detection"):
        _build(ZOO, 3, weights=weights, restore=ZOO.restore.model_copy(update={"type": "detection"}))
    mob = ModelSpec(source="zoo:mobilenetv2_0.25", input_shape=(3, 64, 64), weights=weights)
    with pytest.raises(RestoreError, match="did not expect"):  # a file of another backbone
        mx.random.seed(0)
        build_segmenter(mob, SEG, 3)
    with pytest.raises(ModelSourceError, match="arch is fcn|fcn, but"):
        build_segmenter(ModelSpec(source="zoo:psp_resnet50_ade", input_shape=(3, 64, 64)), SEG, 3)
