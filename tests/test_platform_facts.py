"""Facts about MXNet, oneDNN and mx.onnx that gluontl's code relies on, pinned so that an
upgrade that changes one fails here, by name, instead of somewhere downstream.

Each test says which code relies on the fact. Measured on MXNet 1.9.1 (oneDNN 2.4.4).
"""
from __future__ import annotations

import copy
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
    """gluontl.rules.apply_plan drops cached graphs after setting ``use_global_stats`` (mxinternals.clear_cached_ops): a
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
    """gluontl.mxinternals.param_shape reads the shape from the loaded data: SymbolBlock.imports
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


# ============================================================================ what gluontl.mxinternals relies on

def test_children_and_own_params_are_ordered_tables_of_the_objects():
    """mxinternals.children, own_params, op_kwargs, conv_op_name, dense_args, is_hybridized (and
    surgery's unit paths, naming's structural names): ``_children`` maps attribute names to the
    blocks themselves (not weak references) in registration order, ``_reg_params`` a block's own
    parameters by attribute name, ``_kwargs`` a layer's operator arguments."""
    net = _conv_bn_dense()
    assert isinstance(net._children, dict) and list(net._children) == ["0", "1", "2"]
    assert all(net._children[k] is net[int(k)] for k in "012")
    assert list(net[0]._reg_params) == ["weight", "bias"] and net[0]._reg_params["weight"] is net[0].weight
    assert not net._reg_params and net[1]._reg_params["running_mean"] is net[1].running_mean
    conv, dense = net[0], net[2]
    assert (conv._op_name, conv._kwargs["num_group"], conv._kwargs["layout"]) == ("Convolution", 1, "NCHW")
    assert (dense._units, dense._flatten) == (2, True)
    assert isinstance(conv, mx.gluon.nn.conv_layers._Conv)
    assert isinstance(mx.gluon.rnn.LSTM(4), mx.gluon.rnn.rnn_layer._RNNLayer)
    assert not net._active
    net.hybridize()
    assert net._active
    net.hybridize(False)
    assert not net._active


def test_symbolblock_runs_its_cached_op_until_cleared():
    """mxinternals.cached_graph, replace_cached_graph and set_graph_bn_modes: a SymbolBlock's
    ``_cached_graph`` is ``(input variables, output symbol)`` from construction on, and a
    hybridized block keeps running the graph it built its cached op from until that is cleared."""
    data = mx.sym.var("data")
    doubled = data * 2
    block = mx.gluon.SymbolBlock(doubled, [data])
    inputs, out = block._cached_graph
    assert [s.name for s in inputs] == ["data"] and out.tojson() == doubled.tojson()
    block.hybridize()
    x = mx.nd.ones((1, 2))
    assert block(x).asnumpy().tolist() == [[2, 2]]
    block._cached_graph = (inputs, data * 3)
    assert block(x).asnumpy().tolist() == [[2, 2]], "the old cached op no longer runs: clearing is not needed"
    block._clear_cached_op()
    assert block(x).asnumpy().tolist() == [[3, 3]]


def test_parameterdict_table_and_why_put_param_bypasses_update():
    """mxinternals.param_table and put_param: ``ParameterDict._params`` is the table behind it
    (full names, no prefix applied); ``update`` refuses a name it holds with another Parameter."""
    held = mx.gluon.ParameterDict("p_")
    w = held.get("w", shape=(1,))
    assert dict(held._params) == {"p_w": w}
    other = mx.gluon.ParameterDict()
    other._params["p_w"] = mx.gluon.Parameter("p_w", shape=(1,))
    with pytest.raises(AssertionError, match="different Parameters with the same name"):
        held.update(other)
    new = mx.gluon.Parameter("merged", shape=(1,))
    held._params["merged"] = new
    assert held["merged"] is new and dict(held.items())["merged"] is new
    assert not mx.gluon.Parameter("c", shape=(1,), differentiable=False)._differentiable  # is_differentiable


def test_parameter_data_is_a_list_per_context():
    """mxinternals.param_shape: ``Parameter._data`` is None before initialization, then one array per context."""
    p = mx.gluon.Parameter("w", shape=(2, 3))
    assert p._data is None
    p.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    assert [a.shape for a in p._data] == [(2, 3), (2, 3)]


def test_deepcopy_of_a_block_needs_its_cached_op_cleared():
    """mxinternals.copy_block clears cached ops first: a cached op holds C pointers."""
    net = _conv_bn_dense()
    net.hybridize()
    net(_x())
    with pytest.raises(ValueError, match="pointers cannot be pickled"):
        copy.deepcopy(net)
    net.apply(lambda b: b._clear_cached_op())
    twin = copy.deepcopy(net)
    assert np.array_equal(twin(_x()).asnumpy(), net(_x()).asnumpy())
    assert twin[0].weight is not net[0].weight


@pytest.mark.parametrize("name", ["conv_é→", 'a"b\\c', "tab\tname"])
def test_symbol_json_reader_takes_utf8_but_no_u_escape(name):
    """mxinternals.symjson writes with ``ensure_ascii=False``: MXNet's JSON reader (dmlc-core)
    rejects ``\\uXXXX`` escapes (Python's default for non-ASCII), and reads UTF-8 text and the
    other escapes (quote, backslash, tab) as JSON means them."""
    import json

    graph = json.loads(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name=name).tojson())
    assert graph["nodes"][-1]["name"] == name
    back = mx.sym.load_json(json.dumps(graph, ensure_ascii=False))
    assert back.list_arguments() == ["data", f"{name}_weight", f"{name}_bias"]
    if not name.isascii():
        with pytest.raises(mx.base.MXNetError, match="unknown string escape"):
            mx.sym.load_json(json.dumps(graph))


def test_trainer_sets_up_its_kvstore_and_updaters_lazily():
    """mxinternals.trainer: a Trainer creates its kvstore and copies parameters to it at the first
    step (``_init_kvstore``, ``_init_params``); its ``_params`` are in the order given (the optimizer
    state's indices); with one context and no kvstore the updaters are ``_updaters``, one per
    context; device 0's update counts are the table the optimizer counts on."""
    net = _conv_bn_dense()
    params = list(net.collect_params().values())
    trainer = mx.gluon.Trainer(params, "sgd", {"momentum": 0.9})
    assert trainer._params == params and not trainer._kv_initialized and trainer._params_to_init == params
    trainer._init_kvstore()
    trainer._init_params()
    assert trainer._kv_initialized and not trainer._params_to_init
    assert not trainer._update_on_kvstore and len(trainer._updaters) == 1
    opt = trainer._optimizer
    assert isinstance(opt, mx.optimizer.SGD) and opt._all_index_update_counts[0] is opt._index_update_count
    opt._update_count(0)
    assert opt._index_update_count[0] == 1 and opt._get_lr(0) == opt.learning_rate


def test_dataloader_keeps_its_dataset():
    """mxinternals.loader_dataset: Gluon's DataLoader keeps the dataset it was given as ``_dataset``."""
    dataset = mx.gluon.data.ArrayDataset(np.arange(6))
    assert mx.gluon.data.DataLoader(dataset, batch_size=2)._dataset is dataset


def test_gluoncv_ssd_anchor_generator_remakes_its_anchors():
    """mxinternals.gluoncv (detect.models.fit_ssd_anchors): an SSDAnchorGenerator keeps its base
    size, its two sizes as (s0, sqrt(s0 s1)) and its ratios, and ``_generate_anchors`` with them and
    its step gives its anchors."""
    from gluoncv.model_zoo.ssd.anchor import SSDAnchorGenerator

    gen = SSDAnchorGenerator(0, (300, 300), (30, 60), (1, 2, 0.5), 8, alloc_size=(4, 4))
    gen.initialize()
    assert (tuple(gen._im_size), tuple(gen._ratios)) == ((300, 300), (1, 2, 0.5))
    assert tuple(gen._sizes) == (30, pytest.approx(np.sqrt(30 * 60), rel=1e-12))
    again = gen._generate_anchors(gen._sizes, gen._ratios, 8, (4, 4), (0.5, 0.5))
    assert np.array_equal(np.asarray(again, np.float32), gen.anchors.data().asnumpy())  # stored as float32


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
