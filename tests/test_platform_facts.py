"""Facts about MXNet, oneDNN and mx.onnx that gluontl's code relies on, pinned so that an
upgrade that changes one fails here, by name, instead of somewhere downstream.

Each test says which code relies on the fact. Measured on MXNet 1.9.1 (oneDNN 2.4.4).
"""
from __future__ import annotations

import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import onnx
import pytest
from mxnet import autograd


def _conv_bn_dense(frozen=()):
    """Conv → BatchNorm → Dense; the children whose index is in ``frozen`` get grad_req null."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.BatchNorm(in_channels=4),
            mx.gluon.nn.Dense(2, in_units=4 * 6 * 6))
    net.initialize()
    for i in frozen:
        for p in net[i].collect_params().values():
            p.grad_req = "null"
    return net


def _x():
    return mx.nd.array(np.random.RandomState(0).randn(2, 3, 8, 8))


def _running_mean(net):
    mx.nd.waitall()
    return net[1].running_mean.data().asnumpy().copy()


@pytest.mark.parametrize("hybrid", [False, True])
def test_batchnorm_statistics_move_in_backward_not_in_forward(hybrid):
    """gluontl.rules._notes warns that a BatchNorm in bn: train whose layer and everything
    before it are frozen keeps its statistics: MXNet updates running statistics on CPU in
    the backward pass (not in a recorded forward), and only where backward reaches the layer."""
    for frozen, moves in (((), True), ((0,), True), ((1,), True), ((0, 1), False)):
        net = _conv_bn_dense(frozen)
        if hybrid:
            net.hybridize()
        net(_x())
        before = _running_mean(net)
        with autograd.record():
            y = net(_x())
        assert np.array_equal(_running_mean(net), before), "a recorded forward moved them"
        y.backward()
        assert (not np.array_equal(_running_mean(net), before)) == moves, frozen


@pytest.mark.parametrize("static", [False, True])
def test_batchnorm_mode_is_baked_into_the_cached_graph(static):
    """gluontl.rules.apply_plan drops cached graphs after setting ``use_global_stats``: a
    hybridized block keeps the BN mode it was traced with until its graph is rebuilt."""
    for rebuild in (False, True):
        net = _conv_bn_dense()
        net.hybridize(static_alloc=static, static_shape=static)
        with autograd.record():
            y = net(_x())
        y.backward()
        net[1]._kwargs["use_global_stats"] = True  # what apply_plan does for bn: frozen
        if rebuild:
            net._clear_cached_op()
        before = _running_mean(net)
        with autograd.record():
            y = net(_x())
        y.backward()
        assert np.array_equal(_running_mean(net), before) == rebuild


@pytest.mark.parametrize("static", [False, True])
def test_grad_req_changes_apply_without_rebuilding_the_graph(static):
    """gluontl.rules.apply_plan sets grad_req on live parameters (rules can change between
    steps, e.g. staged unfreezing): the cached graph reads grad_req at every call, so
    null → write, write → add and add → write all apply on the next backward."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=3), mx.gluon.nn.Dense(2, in_units=3))
    net.initialize()
    net.hybridize(static_alloc=static, static_shape=static)
    x = mx.nd.array(np.random.RandomState(0).randn(2, 3))
    w = net[0].weight

    def backward(times=1):
        for _ in range(times):
            with autograd.record():
                y = net(x).sum()
            y.backward()
        mx.nd.waitall()

    w.grad_req = "null"
    backward()  # traced with the weight frozen
    w.grad_req = "write"
    backward()
    once = w.grad().asnumpy().copy()
    assert np.abs(once).sum() > 0
    w.grad_req = "add"
    w.zero_grad()
    backward(2)
    np.testing.assert_array_equal(w.grad().asnumpy(), 2 * once)
    w.grad_req = "write"
    backward(2)
    np.testing.assert_array_equal(w.grad().asnumpy(), once)


def _export(folder):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.Dense(2, in_units=4 * 6 * 6))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 8, 8)))
    net.export(str(folder / "m"))
    return net, folder / "m-symbol.json", folder / "m-0000.params"


def test_mx_onnx_lists_weights_as_graph_inputs(tmp_path):
    """gluontl.export.lean makes weights initializer-only: mx.onnx lists them as graph inputs
    too, which tells onnxruntime they may be fed at run time, so it cannot fold them."""
    _, sym, params = _export(tmp_path)
    path = mx.onnx.export_model(str(sym), str(params), [(1, 3, 8, 8)], np.float32,
                                str(tmp_path / "m.onnx"))
    graph = onnx.load(path).graph
    inits = {t.name for t in graph.initializer}
    assert len(inits) == 4 and inits <= {i.name for i in graph.input}


def test_symbolblock_imports_leaves_parameter_shape_none(tmp_path):
    """gluontl.naming.shape_of reads the shape from the loaded data: SymbolBlock.imports
    loads the arrays into parameters whose ``shape`` stays None."""
    net, sym, params = _export(tmp_path)
    block = mx.gluon.SymbolBlock.imports(str(sym), ["data"], str(params))
    loaded = dict(block.collect_params().items())
    assert len(loaded) == 4
    for p in loaded.values():
        assert p.shape is None and p.data().shape
    assert sorted(p.data().shape for p in loaded.values()) == sorted(
        p.shape for p in net.collect_params().values())


def test_reshape_backward_hands_a_blocked_gradient_to_transpose_which_fails():
    """gluontl/mxinternals/plain_grad.py copies the input of every convolution fed by a reshape: the
    convolution's input gradient comes out in oneDNN's blocked layout, ``_backward_reshape``
    hands it on in place under the reshaped dims, and the oneDNN transpose behind it cannot
    build the reorder. When this stops failing, the copy can go."""
    x, w = mx.sym.var("x"), mx.sym.var("w")
    image = mx.sym.reshape(mx.sym.transpose(x, axes=(0, 2, 1)), shape=(0, 8, 4, 4))
    block = mx.gluon.SymbolBlock(mx.sym.Convolution(image, w, kernel=(1, 1), num_filter=8, no_bias=True), [x, w])
    block.hybridize()
    xn, wn = mx.nd.ones((2, 16, 8)), mx.nd.ones((8, 8, 1, 1))
    xn.attach_grad()
    with autograd.record():
        y = block(xn, wn)
    y.backward()
    with pytest.raises(mx.base.MXNetError, match="could not create a primitive descriptor for a reorder"):
        xn.grad.asnumpy()


def _python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "DNNL_", "MKLDNN_"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(clean, **env), check=True)


@pytest.mark.parametrize("isa,shown", [("AVX2", "isa:Intel AVX2"), ("SSE41", "isa:Intel SSE4.1")])
def test_dnnl_max_cpu_isa_is_honoured(isa, shown):
    """scripts/test.sh runs the suite a second time with DNNL_MAX_CPU_ISA=AVX2 on AVX-512
    machines, so kernels of AVX2-only CPUs are tested everywhere: oneDNN must obey it
    (SSE41 shows it does on an AVX2 machine too, where AVX2 is already native)."""
    conv = ("import gluontl.npcompat, mxnet as mx\n"
            "x, w = mx.nd.ones((1, 3, 8, 8)), mx.nd.ones((4, 3, 3, 3))\n"
            "mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()\n")
    out = _python(conv, DNNL_MAX_CPU_ISA=isa, DNNL_VERBOSE="1", OMP_NUM_THREADS="1").stdout
    assert f"dnnl_verbose,info,cpu,{shown}" in out, out[:500]


@pytest.mark.parametrize("when,honoured", [("before", True), ("after", False)])
def test_omp_num_threads_counts_only_before_import(when, honoured):
    """gluontl.threads.configure sets OMP_NUM_THREADS before gluontl imports MXNet (the CLI
    calls it first) and only reports when MXNet is already imported: the OpenMP pool is
    sized when MXNet loads."""
    wanted = (os.cpu_count() or 1) + 1  # never MXNet's default, which is at most the core count
    set_it = f"os.environ['OMP_NUM_THREADS'] = '{wanted}'\n"
    code = ("import ctypes, os\n" + (set_it if when == "before" else "") + "import gluontl.npcompat, mxnet as mx\n"
            + (set_it if when == "after" else "")
            + "mx.nd.dot(mx.nd.ones((64, 64)), mx.nd.ones((64, 64))).wait_to_read()\n"
              "print(ctypes.CDLL('libgomp.so.1').omp_get_max_threads())\n")
    threads = int(_python(code).stdout.split()[-1])
    assert (threads == wanted) == honoured, threads


def test_mxnet_dataloader_takes_no_multiprocessing_context():
    """MXNet 1.9.1's DataLoader starts ``multiprocessing.Pool`` in the process's default start
    method and has no argument for another, so gluontl cannot pass one: workers under spawn and
    forkserver (the default on Python 3.14 and macOS) work because the dataset pickles and the
    workers import gluontl's compat layer (tests/data/test_data.py runs both)."""
    import inspect

    from mxnet.gluon.data import dataloader

    params = set(inspect.signature(dataloader.DataLoader.__init__).parameters)
    assert not params & {"context", "mp_context", "multiprocessing_context", "start_method"}
    assert "multiprocessing.Pool(" in inspect.getsource(dataloader.DataLoader.__init__)


def test_mxnet_metadata_and_recordio_need_the_numpy_2_repack_and_patch():
    """Why scripts/mxnet_np2_wheel.py and npcompat's recordio patch exist: mxnet 1.9.1 declares
    ``numpy<2`` (the repacked 1.9.1+np2 declares ``numpy>1.16.0``), and its ``pack``/``pack_img``
    call ``ndarray.tostring``, which numpy 2.3 removed."""
    import importlib.metadata
    import inspect

    from gluontl import npcompat

    meta = importlib.metadata.distribution("mxnet")
    numpy_req = [r for r in meta.requires or [] if r.startswith("numpy")]
    if meta.version == "1.9.1+np2":
        assert numpy_req == ["numpy (>1.16.0)"]
    else:
        assert meta.version == "1.9.1" and numpy_req == ["numpy (<2.0.0,>1.16.0)"]
    recordio = importlib.import_module("mxnet.recordio")
    own = (recordio.pack, recordio.pack_img) if not npcompat.NEEDS_TOBYTES else None
    if own is not None:  # numpy still has tostring: mxnet's own functions, which call it
        assert all(".tostring()" in inspect.getsource(f) for f in own)
