"""Keras-family graphs (tests/onnx/test_keras_exports.py: tf2onnx-style and Keras->PyTorch-style)
go out as their own graph: export verifies them against the block (float32 bound) at batch 1 and
2, the file computes what the source file computes, and after an SGD step it carries the trained
weights, folded Transpose pairs and all."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest

from gluontl.export import export_onnx
from gluontl.onnx import import_model
from gluontl.rules import trainable_params
from tests.helpers import assert_f32_close, ort_run
from tests.onnx.test_keras_exports import BUDGET, BUILDERS, _x


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_keras_family_graph_re_exports_verified_and_trained(name, tmp_path):
    source = tmp_path / f"{name}.onnx"
    onnx.save(BUILDERS[name](), str(source))
    block = import_model(str(source))
    terms, depth = BUDGET[name]
    out = export_onnx(block, tmp_path / "same.onnx")  # verified at batch 1 and 2
    x = _x(2, seed=9)
    assert_f32_close(ort_run(str(out), x)[0], ort_run(str(source), x)[0], terms=terms, depth=depth)
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops == [n.op_type for n in onnx.load(str(source)).graph.node]  # the same graph, patched

    params = trainable_params(block)
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(block(mx.nd.array(x)), mx.nd.array([0, 2]))
    loss.backward()
    trainer.step(2)
    trained = export_onnx(block, tmp_path / "trained.onnx")
    with mx.autograd.predict_mode():
        want = block(mx.nd.array(x)).asnumpy()
    assert_f32_close(ort_run(str(trained), x)[0], want, terms=terms, depth=depth)
    assert np.abs(want - ort_run(str(source), x)[0]).max() > 1e-3  # the step changed the outputs
