"""Write tests/onnx/fixtures/tf2onnx/: small Keras models exported by the real tf2onnx.

What tf2onnx writes for a Keras model (issue 39): NHWC input with one Transpose to NCHW (its
optimiser pushes the per-Conv Transpose pairs through the graph and cancels them), Conv with
explicit pads when the input size is fixed and ``auto_pad`` SAME_UPPER when H/W are free,
DepthwiseConv2D as a grouped Conv, BatchNormalization, Keras PReLU as
``Relu(x) + Mul(Relu(Neg(x)), -alpha)`` (tf2onnx has no PReLU rewriter: the ONNX ``PRelu`` op
comes only from its TFLite front end, used here too), Dense as MatMul + Add; Keras LSTM, GRU
and Bidirectional(LSTM) become the ONNX ``LSTM``/``GRU`` ops (its RNN rewriters), while a Keras
SimpleRNN and an LSTM written with ``tf.while_loop`` become a ``Loop`` with no trip count, a
condition the body recomputes, the weights as loop-carried values and the TensorArray as a
scan output (with ``maximum_iterations`` the trip count is that constant).

Weights are drawn from a seeded numpy RandomState (biases, BatchNorm statistics and PReLU
slopes away from Keras's zeros and ones, which tf2onnx would fold away or deduplicate).
tensorflow is never a project dependency; run with the tf venv:

    /work/venvs/tf/bin/python scripts/make_tf_fixtures.py

Tested with tensorflow-cpu 2.15.1, tf2onnx 1.16.1, onnx 1.17.0, protobuf 3.20.3, onnxruntime
1.20.1 on Python 3.11.7 (MANIFEST.json records them per file, with the onnxruntime-vs-tensorflow
error and sha256). The Keras CNN files regenerate byte-identical. The others do
not: their weights, op types and onnxruntime outputs are the same on every run, but tf2onnx
names the nodes it makes from a per-process counter in the order it meets TF's graph nodes,
and that order (after TF's grappler and, for TFLite, its MLIR converter) changes from run to
run, PYTHONHASHSEED=0 or not (``const_fold_opt__144`` in one run is ``__145`` in the next).
So MANIFEST.json records, besides each file's sha256, a ``fingerprint``: the sha256 of its op
types (subgraphs included), its initializers' values and onnxruntime's output bytes on a fixed
input, all independent of names; ``--check`` regenerates into a scratch folder and compares
both (``--out DIR`` keeps the files).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import google.protobuf  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "onnx" / "fixtures" / "tf2onnx"
L = tf.keras.layers
SIZE, CLASSES = 15, 4  # odd: SAME at stride 2 pads one more at the bottom/right
T, FEATURES, HIDDEN = 6, 5, 7  # sequence length, input features, LSTM units


def cnn(size: int | None) -> tf.keras.Model:
    """Conv2D same/stride 2 (odd size), PReLU per channel, Conv2D valid, DepthwiseConv2D
    same/stride 2, BatchNormalization, ReLU, global average pooling, Dense, PReLU on 2-D."""
    x = L.Input((size, size, 3), name="image")
    y = L.Conv2D(8, 3, strides=2, padding="same", name="conv_same")(x)
    y = L.PReLU(shared_axes=[1, 2], name="prelu")(y)
    y = L.Conv2D(8, 3, padding="valid", name="conv_valid")(y)
    y = L.DepthwiseConv2D(3, strides=2, padding="same", name="depthwise")(y)
    y = L.BatchNormalization(name="bn")(y)
    y = L.ReLU(name="relu")(y)
    y = L.GlobalAveragePooling2D(name="pool")(y)
    y = L.Dense(CLASSES, name="dense")(y)
    y = L.PReLU(name="prelu_logits")(y)
    return tf.keras.Model(x, y, name="cnn")


def keras_lstm() -> tf.keras.Model:
    x = L.Input((T, FEATURES), name="seq")
    y = L.LSTM(HIDDEN, unroll=False, name="lstm")(x)
    return tf.keras.Model(x, L.Dense(3, name="dense")(y), name="keras_lstm")


def keras_simplernn() -> tf.keras.Model:
    """tf2onnx has no SimpleRNN rewriter: the Keras layer's while loop stays a Loop."""
    x = L.Input((T, FEATURES), name="seq")
    y = L.SimpleRNN(HIDDEN, name="simple_rnn")(x)
    return tf.keras.Model(x, L.Dense(3, name="dense")(y), name="keras_simplernn")


def keras_gru_bilstm() -> tf.keras.Model:
    """GRU (reset_after, Keras's default) returning sequences into a bidirectional LSTM."""
    x = L.Input((T, FEATURES), name="seq")
    y = L.GRU(HIDDEN, return_sequences=True, name="gru")(x)
    y = L.Bidirectional(L.LSTM(4, name="lstm"), name="bilstm")(y)
    return tf.keras.Model(x, L.Dense(3, name="dense")(y), name="keras_gru_bilstm")


class WhileLSTM(L.Layer):
    """An LSTM written out with tf.while_loop and a TensorArray (the form of hand-written and
    TF1-style RNNs that tf2onnx's LSTM rewriters do not match): tf2onnx writes a Loop."""

    def __init__(self, maximum_iterations=None, **kwargs):
        super().__init__(**kwargs)
        self.maximum_iterations = maximum_iterations  # tf2onnx writes it as the Loop's trip count

    def build(self, shape):
        self.kernel = self.add_weight(name="kernel", shape=(shape[-1], 4 * HIDDEN))
        self.recurrent_kernel = self.add_weight(name="recurrent_kernel", shape=(HIDDEN, 4 * HIDDEN))
        self.bias = self.add_weight(name="bias", shape=(4 * HIDDEN,))

    def call(self, x):
        xs = tf.transpose(x, [1, 0, 2])
        h0 = tf.zeros([tf.shape(x)[0], HIDDEN])
        ta = tf.TensorArray(tf.float32, size=T)

        def body(t, h, c, ta):
            z = tf.matmul(xs[t], self.kernel) + tf.matmul(h, self.recurrent_kernel) + self.bias
            i, f, g, o = tf.split(z, 4, axis=1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
            return t + 1, h, c, ta.write(t, h)

        _, _, _, ta = tf.while_loop(lambda t, h, c, ta: t < T, body, [0, h0, h0, ta],
                                    maximum_iterations=self.maximum_iterations)
        return tf.transpose(ta.stack(), [1, 0, 2])  # [batch, T, HIDDEN]


def while_lstm(maximum_iterations=None) -> tf.keras.Model:
    x = L.Input((T, FEATURES), name="seq")
    y = WhileLSTM(maximum_iterations, name="while_lstm")(x)
    return tf.keras.Model(x, L.Dense(3, name="dense")(y[:, -1]), name="while_lstm")


def set_weights(model: tf.keras.Model, seed: int) -> None:
    rs = np.random.RandomState(seed)
    values = []
    for w in model.weights:
        shape, name = tuple(w.shape), w.name
        if "moving_variance" in name or "gamma" in name:
            values.append(np.abs(rs.randn(*shape)) * 0.5 + 0.5)
        elif "bias" in name or "beta" in name or "moving_mean" in name or "alpha" in name:
            values.append(rs.randn(*shape) * (0.25 if "alpha" in name else 0.1))
        else:
            fan = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            values.append(rs.randn(*shape) * np.sqrt(1.0 / fan))
    model.set_weights([v.astype(np.float32) for v in values])


def data(shape, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# (file, model builder, kwargs, seed, opset, front end, test input shape)
JOBS = [
    ("keras_cnn_op13.onnx", cnn, {"size": SIZE}, 0, 13, "keras", (SIZE, SIZE, 3)),
    ("keras_cnn_freehw_op17.onnx", cnn, {"size": None}, 0, 17, "keras", (SIZE, SIZE, 3)),
    ("tflite_cnn_op13.onnx", cnn, {"size": SIZE}, 0, 13, "tflite", (SIZE, SIZE, 3)),
    ("keras_lstm_op13.onnx", keras_lstm, {}, 1, 13, "keras", (T, FEATURES)),
    ("keras_simplernn_op13.onnx", keras_simplernn, {}, 3, 13, "keras", (T, FEATURES)),
    ("keras_gru_bilstm_op15.onnx", keras_gru_bilstm, {}, 4, 15, "keras", (T, FEATURES)),
    ("while_lstm_op13.onnx", while_lstm, {}, 2, 13, "keras", (T, FEATURES)),
    ("while_lstm_op17.onnx", while_lstm, {}, 2, 17, "keras", (T, FEATURES)),
    ("while_lstm_maxiter_op13.onnx", while_lstm, {"maximum_iterations": T}, 2, 13, "keras", (T, FEATURES)),
]


def convert(model: tf.keras.Model, front: str, opset: int, scratch: Path) -> onnx.ModelProto:
    spec = [tf.TensorSpec((None,) + tuple(model.input.shape[1:]), tf.float32, name=model.input.name)]
    if front == "keras":
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
        return proto
    conv = tf.lite.TFLiteConverter.from_keras_model(model)  # float32, no quantization
    tfl = scratch / "model.tflite"
    tfl.write_bytes(conv.convert())
    proto, _ = tf2onnx.convert.from_tflite(str(tfl), opset=opset)
    return proto


def check(model: tf.keras.Model, path: Path, shape) -> float:
    """Largest relative error of onnxruntime vs tensorflow at batch 1 and 2."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    errs = []
    for batch in (1, 2):
        x = data((batch,) + shape, 100 + batch)
        ref = model.predict(x, verbose=0)  # graph mode, as exported (eager while_loop with
        # maximum_iterations raises a TypeError in TF 2.15)
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        if got.shape != ref.shape:
            raise RuntimeError(f"{path.name}: onnxruntime gives {got.shape}, tensorflow {ref.shape}")
        errs.append(float(np.abs(got - ref).max() / np.abs(ref).max()))
    if not max(errs) <= 1e-5:
        raise RuntimeError(f"{path.name}: onnxruntime differs from tensorflow by {max(errs):.2e}")
    return max(errs)


def _ops_and_weights(graph: onnx.GraphProto, ops: list, weights: list) -> None:
    for t in graph.initializer:
        a = onnx.numpy_helper.to_array(t)
        weights.append(hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest())
    for n in graph.node:
        ops.append(n.op_type)
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _ops_and_weights(attr.g, ops, weights)


def fingerprint(path: Path, shape) -> str:
    """sha256 of what a file computes, not what it calls things: op types, initializer values
    (both sorted) and onnxruntime's output on a fixed input of batch 2."""
    ops, weights = [], []
    _ops_and_weights(onnx.load(str(path)).graph, ops, weights)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: data((2,) + shape, 7)})[0]
    return hashlib.sha256(json.dumps([sorted(ops), sorted(weights)]).encode() + out.tobytes()).hexdigest()


def make(out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    fixtures = []
    with tempfile.TemporaryDirectory() as scratch:
        for file, build, kwargs, seed, opset, front, shape in JOBS:
            tf.keras.backend.clear_session()
            tf.keras.utils.set_random_seed(seed)
            model = build(**kwargs)
            set_weights(model, seed)
            proto = convert(model, front, opset, Path(scratch))
            proto.producer_version = tf2onnx.version.version  # without the git hash suffix
            path = out / file
            onnx.save(proto, str(path))
            err = check(model, path, shape)
            ops = [n.op_type for n in proto.graph.node]
            fixtures.append({
                "file": file, "front_end": front, "keras_model": model.name, "opset": opset,
                "input": proto.graph.input[0].name, "test_shape": list(shape),
                "free_hw": front == "keras" and kwargs.get("size", 0) is None,
                "op_types": sorted(set(ops)), "loop": "Loop" in ops, "ort_vs_tf": err,
                "bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "fingerprint": fingerprint(path, shape),
                "tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__,
                "protobuf": google.protobuf.__version__, "onnxruntime": ort.__version__,
                "python": platform.python_version()})
            print(f"ok   {file}: {path.stat().st_size / 1e3:.1f} kB, ort vs tf {err:.1e}, ops {ops}")
    return fixtures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a scratch folder and compare sha256 with MANIFEST.json")
    ap.add_argument("--out", type=Path, help="with --check: keep the regenerated files here")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            made = make(args.out or Path(tmp))
        have = {f["file"]: f for f in json.loads((OUT / "MANIFEST.json").read_text())["fixtures"]}
        same = [f["file"] for f in made if have.get(f["file"], {}).get("sha256") == f["sha256"]]
        alike = [f["file"] for f in made if have.get(f["file"], {}).get("fingerprint") == f["fingerprint"]]
        print(f"byte-identical: {same}\nsame ops, weights and onnxruntime output: {alike}")
        return 0 if len(alike) == len(made) == len(have) else 1
    fixtures = make(OUT)
    (OUT / "MANIFEST.json").write_text(json.dumps({"fixtures": fixtures}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
