"""BERT-style text encoders from PyTorch's exporters import, train and re-export (issue 39).

The fixtures (``tests/onnx/fixtures/text/``, from ``scripts/make_text_fixtures.py``) are one
hand-built 2-layer encoder exported by the legacy exporter at opsets 14 (LayerNorm as
ReduceMean/Sub/Pow/Sqrt/Div) and 17 (LayerNormalization) and by dynamo at 17 and 18: int64
``input_ids``/``attention_mask`` with free batch and sequence axes, a 30,522-row embedding
Gather, position ids from ``Range(Shape)``, the mask through Unsqueeze/Expand into a Where on
4-D attention scores, Softmax, erf GELU, masked mean pooling. MXNet fixes shapes when the graph
is built; without ``input_shapes`` the sequence axis stays free inside the block as the batch does
(shape arithmetic computed at run time: ``arange_like`` position ids, mask broadcasts by
``broadcast_like``, reshape codes), and ``input_shapes`` fixes it (padding with the mask is exact).
The re-exported file keeps both axes free. References: onnxruntime's float kernels for forward
values, and onnx's reference evaluator in float64 for gradients.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from gluontl.errors import OnnxImportError, SurgeryError
from gluontl.export import export_onnx
from gluontl.mxinternals import onnx_info
from gluontl.onnx import import_model
from gluontl.recipe import HeadSpec, SurgerySpec
from gluontl.surgery import apply_surgery
from tests.helpers import assert_f32_close, f32_tol, ort_run
from tests.onnx.test_conv_after_reshape import EPS64, LAYERS, Erf, Gelu, _float64_trainable

FIXTURES = Path(__file__).parent / "fixtures" / "text"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]
ENTRIES = [pytest.param(e, id=e["file"][:-len(".onnx")]) for e in MANIFEST]
SEQS = (7, 12)  # the export's example length and another one
FREE = ((1, 7), (2, 12), (3, 30))  # (batch, length) pairs one free-length import runs at
VOCAB = MANIFEST[0]["vocab"]


@functools.lru_cache(maxsize=None)
def _import(file: str, seq: int):
    return import_model(str(FIXTURES / file), input_shapes={"input_ids": [None, seq],
                                                            "attention_mask": [None, seq]})


def _tokens(batch: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ids over the whole vocabulary (the table's last rows too); rows after the first padded."""
    rs = np.random.RandomState(seed + 10 * batch + seq)
    ids = rs.randint(0, VOCAB, (batch, seq)).astype(np.int64)
    ids[0, 0] = VOCAB - 1
    mask = np.ones((batch, seq), np.int64)
    for i in range(1, batch):
        mask[i, seq - 2 * i:] = 0
    return ids, mask


def _run(block, ids, mask) -> np.ndarray:
    return block(mx.nd.array(ids, dtype="int64"), mx.nd.array(mask, dtype="int64")).asnumpy()


def _sgd_step(block, ids, mask):
    """One SGD step on the squared output: the trainable parameters, and their values before."""
    params = {n: p for n, p in block.collect_params().items() if p.grad_req == "write"}
    before = {n: p.data().asnumpy().copy() for n, p in params.items()}
    trainer = mx.gluon.Trainer(list(params.values()), "sgd", {"learning_rate": 0.1})
    with mx.autograd.record():
        loss = (block(mx.nd.array(ids, dtype="int64"), mx.nd.array(mask, dtype="int64")) ** 2).sum()
    loss.backward()
    trainer.step(1)
    return params, before


def _depth(path: Path) -> int:
    """Contractions and normalisations along the graph (helpers.f32_tol's ``depth``)."""
    return sum(n.op_type in LAYERS for n in onnx.load(str(path)).graph.node)


def test_manifest_records_every_file_its_hash_and_both_exporters():
    assert {e["file"] for e in MANIFEST} == {p.name for p in FIXTURES.glob("*.onnx")}
    for e in MANIFEST:
        assert hashlib.sha256((FIXTURES / e["file"]).read_bytes()).hexdigest() == e["sha256"], e["file"]
    assert {e["exporter"] for e in MANIFEST} == {"legacy", "dynamo"}
    assert {(e["exporter"], e["opset"]) for e in MANIFEST} >= {("legacy", 14), ("legacy", 17), ("dynamo", 17),
                                                              ("dynamo", 18)}
    ops = [set(e["op_types"]) for e in MANIFEST]
    assert any({"ReduceMean", "Pow", "Sqrt"} <= o for o in ops) and any("LayerNormalization" in o for o in ops)
    assert all({"Gather", "Expand", "Where", "Softmax", "Erf", "MatMul", "Range"} <= o for o in ops)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("seq", SEQS)
def test_matches_onnxruntime_at_batch_1_and_2(entry, seq):
    path = FIXTURES / entry["file"]
    block = _import(entry["file"], seq)
    for batch in (1, 2):
        ids, mask = _tokens(batch, seq)
        got = _run(block, ids, mask)
        (ref,) = ort_run(str(path), {"input_ids": ids, "attention_mask": mask})
        assert got.shape == ref.shape == (batch, entry["hidden"])
        assert_f32_close(got, ref, terms=16, depth=_depth(path), err_msg=f"{entry['file']} {batch}x{seq}")


@pytest.mark.parametrize("entry", ENTRIES)
def test_padding_is_masked_out(entry):
    """Changing padded tokens changes nothing: the mask reaches the scores and the pooling."""
    block = _import(entry["file"], 7)
    ids, mask = _tokens(2, 7)
    other = ids.copy()
    other[mask == 0] = 5
    np.testing.assert_array_equal(_run(block, ids, mask), _run(block, other, mask))


@pytest.mark.parametrize("entry", ENTRIES)
def test_shorter_sequences_run_padded_to_the_import_length(entry):
    """One import serves every length up to its own: 7 tokens padded to 12 (mask 0) give
    onnxruntime's output for the 7 tokens alone."""
    path = FIXTURES / entry["file"]
    ids, mask = _tokens(2, 7, seed=4)
    padded_ids, padded_mask = np.zeros((2, 12), np.int64), np.zeros((2, 12), np.int64)
    padded_ids[:, :7], padded_mask[:, :7] = ids, mask
    got = _run(_import(entry["file"], 12), padded_ids, padded_mask)
    (ref,) = ort_run(str(path), {"input_ids": ids, "attention_mask": mask})
    assert_f32_close(got, ref, terms=16, depth=_depth(path))


@pytest.mark.parametrize("entry", ENTRIES)
def test_another_length_than_imported_says_what_to_do(entry):
    block = _import(entry["file"], 7)
    ids, mask = _tokens(2, 9)
    with pytest.raises(OnnxImportError, match=r"'input_ids' has shape \(2, 9\).*imported for \['N', 7\]"
                                              r".*input_shapes.*pad"):
        _run(block, ids, mask)


@pytest.mark.parametrize("entry", ENTRIES)
def test_hybridized_equals_imperative(entry):
    block = _import(entry["file"], 7)
    ids, mask = _tokens(2, 7, seed=3)
    plain = _run(block, ids, mask)
    block.hybridize(static_alloc=True, static_shape=True)
    try:
        hybrid = _run(block, ids, mask)
    finally:
        block.hybridize(active=False)
    assert_f32_close(hybrid, plain, terms=16, depth=_depth(FIXTURES / entry["file"]))


@pytest.mark.parametrize("entry", ENTRIES)
def test_free_length_import_runs_at_every_batch_and_length(entry):
    """Without input_shapes both axes stay free inside the block: one import runs at three
    (batch, length) pairs, imperative and hybridized, as onnxruntime does."""
    path = FIXTURES / entry["file"]
    block = import_model(str(path))
    info = onnx_info(block)
    assert info.input_shapes == {"input_ids": (None, None), "attention_mask": (None, None)}
    assert {n: {k: s for k, (s, _) in a.items()} for n, a in info.free_axes.items()} == {
        "input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}}
    for hybrid in (False, True):
        if hybrid:
            block.hybridize()
        for batch, seq in FREE:
            ids, mask = _tokens(batch, seq)
            (ref,) = ort_run(str(path), {"input_ids": ids, "attention_mask": mask})
            got = _run(block, ids, mask)
            assert got.shape == ref.shape == (batch, entry["hidden"])
            assert_f32_close(got, ref, terms=16, depth=_depth(path),
                             err_msg=f"{entry['file']} {batch}x{seq} hybridized={hybrid}")


@pytest.mark.parametrize("entry", ENTRIES)
def test_free_length_sgd_step_and_reexport(entry, tmp_path):
    """A free-length import trains at one length (the position rows of that length move, and
    every other weight) and re-exports with both axes free, verified on its sample."""
    path = FIXTURES / entry["file"]
    block = import_model(str(path))
    ids, mask = _tokens(3, 11, seed=6)
    params, before = _sgd_step(block, ids, mask)
    assert len(params) == 36
    for n, p in params.items():
        moved = np.any(p.data().asnumpy() != before[n], axis=tuple(range(1, before[n].ndim)))
        if n == "position_embeddings.weight":
            np.testing.assert_array_equal(np.flatnonzero(moved), np.arange(11))
        elif n == "word_embeddings.weight":
            np.testing.assert_array_equal(np.flatnonzero(moved), np.unique(ids[mask == 1]))
        elif not n.endswith(".key.bias"):  # softmax drops q·b_k (see the SGD test above)
            assert moved.any(), f"{n} did not move"
    out = export_onnx(block, tmp_path / "free.onnx", sample={"input_ids": ids, "attention_mask": mask})
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(out)).graph.input]
    assert all(isinstance(d, str) for dd in dims for d in dd), dims
    for batch, seq in FREE:
        ids, mask = _tokens(batch, seq, seed=2)
        (got,) = ort_run(str(out), {"input_ids": ids, "attention_mask": mask})
        assert_f32_close(got, _run(block, ids, mask), terms=16, depth=_depth(path))


def test_free_length_surgery_head_on_the_pooled_output():
    """Surgery on a free-length import sizes the mask from the first input's length."""
    block = import_model(str(FIXTURES / MANIFEST[0]["file"]))
    net = apply_surgery(block, SurgerySpec(head=HeadSpec(classes=2, inputs=["pooled"])), (9,))
    for batch, seq in FREE:
        ids, mask = _tokens(batch, seq)
        assert _run(net, ids, mask).shape == (batch, 2)


@pytest.mark.parametrize("entry", ENTRIES)
def test_tables_train_under_their_torch_names(entry):
    """The position table is gathered at ``arange(S)``: it trains whole, under its own name
    (not as a folded [1, S, H] slice), so the export keeps gathering by length."""
    params = _import(entry["file"], 7).collect_params()
    trainable = {n: p.shape for n, p in params.items() if p.grad_req == "write"}
    assert trainable["word_embeddings.weight"] == (VOCAB, entry["hidden"])
    assert trainable["position_embeddings.weight"] == (entry["max_positions"], entry["hidden"])
    assert set(entry["torch_names"]) <= set(trainable)
    inits = {t.name for t in onnx.load(str(FIXTURES / entry["file"])).graph.initializer}
    assert set(trainable) <= inits and len(trainable) == 36


@pytest.mark.parametrize("entry", ENTRIES)
def test_sgd_step_moves_every_weight_and_only_the_rows_of_kept_tokens(entry):
    ids, mask = _tokens(2, 7, seed=5)
    params, before = _sgd_step(_import.__wrapped__(entry["file"], 7), ids, mask)
    for n, p in params.items():
        after = p.data().asnumpy()
        assert np.isfinite(after).all(), n
        moved = np.any(after != before[n], axis=tuple(range(1, after.ndim)))
        if n == "word_embeddings.weight":
            # padded tokens reach neither the scores (exp(-1e4) is 0) nor the pooling
            np.testing.assert_array_equal(np.flatnonzero(moved), np.unique(ids[mask == 1]))
        elif n == "position_embeddings.weight":
            np.testing.assert_array_equal(np.flatnonzero(moved), np.arange(7))
        elif n.endswith(".key.bias"):  # q·b_k is the same for every key: softmax drops it
            query = params[n.replace(".key.", ".query.")].grad().asnumpy()
            assert np.abs(p.grad().asnumpy()).max() <= f32_tol(np.abs(query).max(), 16, _depth(
                FIXTURES / entry["file"])), n
        else:
            assert moved.any(), f"{n} did not move"


@pytest.mark.parametrize("entry", ENTRIES)
def test_reexport_keeps_batch_and_sequence_free(entry, tmp_path):
    """The export is the source graph with the block's values: verified by export_onnx on
    real token ids, then run by onnxruntime at a batch and a length the import never saw,
    against the original file with the same weights."""
    path = FIXTURES / entry["file"]
    block = _import(entry["file"], 7)
    ids, mask = _tokens(2, 7, seed=1)
    out = export_onnx(block, tmp_path / "again.onnx", sample={"input_ids": ids, "attention_mask": mask})
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(out)).graph.input]
    assert all(isinstance(a, str) and isinstance(b, str) for a, b in dims), dims
    for batch, seq in ((1, 7), (3, 12), (2, 30)):
        ids, mask = _tokens(batch, seq, seed=2)
        (got,) = ort_run(str(out), {"input_ids": ids, "attention_mask": mask})
        (ref,) = ort_run(str(path), {"input_ids": ids, "attention_mask": mask})
        assert_f32_close(got, ref, terms=16, depth=_depth(path))


# ------------------------------------------------------------------ fine-tuning (acceptance)

def _float64_model(source: onnx.ModelProto):
    """Pooled features and cross-entropy in float64: the ONNX graph by onnx's reference
    evaluator (numpy kernels), the 2-class head (``head.fc``) and the loss in numpy.
    Independent of MXNet and of the importer."""
    evaluator = ReferenceEvaluator(_float64_trainable(source, set(source_weights(source))),
                                   new_ops=[Erf, Gelu])

    def logits(weights: dict[str, np.ndarray], ids, mask) -> np.ndarray:
        pooled = evaluator.run(None, {"input_ids": ids, "attention_mask": mask,
                                      **{n: w for n, w in weights.items() if not n.startswith("head.")}})[0]
        return pooled @ weights["head.fc.weight"].T + weights["head.fc.bias"]

    def loss(weights: dict[str, np.ndarray], ids, mask, labels) -> float:
        z = logits(weights, ids, mask)
        top = z.max(1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(z - top).sum(1))
        return float(np.sum(lse - z[np.arange(len(labels)), labels]))
    return logits, loss


def source_weights(source: onnx.ModelProto) -> list[str]:
    return [t.name for t in source.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims]


def test_the_default_head_cut_asks_where_on_a_text_model():
    """Rank-3 tensors of a text model are tokens or attention maps, not feature maps to pool."""
    block = _import(MANIFEST[-1]["file"], 7)
    with pytest.raises(SurgeryError, match=r"integer input.*input_ids.*head.inputs"):
        apply_surgery(block, SurgerySpec(head=HeadSpec(classes=2)), (7,))


@pytest.mark.parametrize("entry", [ENTRIES[0], ENTRIES[-1]])
def test_finetune_new_head_gradients_match_float64_central_differences(entry, tmp_path):
    """Import → surgery (a 2-class head on the mean-pooled output) → a few SGD steps on token
    ids lower the loss; then every weight's gradient (the 36 encoder weights and the head's 2)
    matches float64 central differences along the gradient and along a random direction,
    within the float32 bound (as in test_conv_after_reshape: f32_tol per element at the
    gradient's size, depth = 2 × (the graph's contractions and normalisations + the head),
    plus the float64 difference's own rounding). The fine-tuned model re-exports (the source
    graph with the head appended) and runs at a length it was never imported at."""
    path = FIXTURES / entry["file"]
    mx.random.seed(0)
    block = import_model(str(path), input_shapes={"input_ids": [None, 9], "attention_mask": [None, 9]})
    net = apply_surgery(block, SurgerySpec(head=HeadSpec(classes=2, inputs=["pooled"])), (9,))
    net.hybridize()
    ids, mask = _tokens(4, 9, seed=7)
    labels = np.array([0, 1, 1, 0])
    x = (mx.nd.array(ids, dtype="int64"), mx.nd.array(mask, dtype="int64"))
    params = {n: p for n, p in net.collect_params().items() if p.grad_req == "write"}
    trainer = mx.gluon.Trainer(list(params.values()), "sgd", {"learning_rate": 0.2})
    ce = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for _ in range(4):
        with mx.autograd.record():
            loss = ce(net(*x), mx.nd.array(labels)).sum()
        loss.backward()
        losses.append(float(loss.asscalar()))
        trainer.step(len(labels))
    assert losses[-1] < losses[0], losses

    with mx.autograd.record():
        loss = ce(net(*x), mx.nd.array(labels)).sum()
    loss.backward()
    grads = {n: p.grad().asnumpy().astype(np.float64) for n, p in params.items()}
    weights = {n: p.data().asnumpy().astype(np.float64) for n, p in params.items()}
    source = onnx.load(str(path))
    assert set(params) == set(source_weights(source)) | {"head.fc.weight", "head.fc.bias"}
    assert all(np.isfinite(g).all() for g in grads.values())
    logits, reference = _float64_model(source)
    here = reference(weights, ids, mask, labels)
    assert abs(here - float(loss.asscalar())) <= 1e-4 * max(1.0, abs(here))

    rng = np.random.RandomState(0)
    depth = 2 * (_depth(path) + 1)
    size = abs(here) + 1.0
    for name, g in grads.items():
        w = weights[name]
        random = rng.standard_normal(w.shape)
        if name == "word_embeddings.weight":  # the rows the batch reads (the others' gradient is
            random[np.setdiff1d(np.arange(len(w)), ids)] = 0  # exactly 0, see the SGD test)
        for d in (g, random):
            step = 1e-6 * (np.sqrt(np.mean(w ** 2)) + 1e-3) / (np.sqrt(np.mean(d ** 2)) + 1e-30)
            central = (reference({**weights, name: w + step * d}, ids, mask, labels)
                       - reference({**weights, name: w - step * d}, ids, mask, labels)) / (2 * step)
            bound = np.sum(np.abs(d)) * f32_tol(np.abs(g).max(), terms=256, depth=depth) \
                + 64 * depth * EPS64 * size / step
            assert abs(central - np.sum(g * d)) <= bound, (name, central, np.sum(g * d), bound)

    out = export_onnx(net, tmp_path / "finetuned.onnx", sample={"input_ids": ids, "attention_mask": mask})
    ids, mask = _tokens(3, 16, seed=8)
    (got,) = ort_run(str(out), {"input_ids": ids, "attention_mask": mask})
    assert_f32_close(got, logits(weights, ids, mask), terms=16, depth=_depth(path) + 1)
