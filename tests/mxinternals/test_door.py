"""gluontl.mxinternals, the one door to MXNet's internals: symbol JSON that loads back whatever the
layer names, per-block state that follows copies, BatchNorm mode written into a graph, the Trainer set
up before its first step. The MXNet behaviour each relies on is pinned in tests/test_platform_facts.py."""
from __future__ import annotations

import dataclasses

import mxnet as mx
import numpy as np
import pytest

from gluontl.adapters import add_lora, merge_adapters
from gluontl.mxinternals import (block_state, cached_graph, clear_cached_ops, copy_block, count_update, graph_of,
                                 init_trainer, lora_record, onnx_info, set_graph_bn_modes, set_onnx_info,
                                 symbol_from, symbol_json, trainer_params, trainer_updaters)
from tests.helpers import assert_f32_close

NAMES = ["conv_é→ü", 'quote"and\\backslash', "tab\tname"]


def _graph(name: str) -> mx.sym.Symbol:
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, kernel=(1, 1), num_filter=2, name=f"{name}_conv")
    return mx.sym.BatchNorm(conv, fix_gamma=False, name=f"{name}_bn")


def _block(name: str) -> mx.gluon.SymbolBlock:
    block = mx.gluon.SymbolBlock(_graph(name), [mx.sym.var("data")])
    block.initialize(mx.init.Uniform(1.0))
    block(_x())  # shapes known
    rng = np.random.RandomState(1)
    block.params[f"{name}_bn_moving_mean"].set_data(mx.nd.array(rng.uniform(-1, 1, 2)))
    block.params[f"{name}_bn_moving_var"].set_data(mx.nd.array(rng.uniform(0.5, 2, 2)))
    return block


def _x() -> mx.nd.NDArray:
    return mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (3, 2, 2, 2)))


@pytest.mark.parametrize("name", NAMES)
def test_an_edited_graph_loads_back_with_its_names(name):
    graph = graph_of(_graph(name))
    graph["nodes"][-1]["attrs"]["eps"] = "0.25"  # an edit, as surgery and rules make them
    back = symbol_from(graph)
    assert back.list_arguments() == ["data", f"{name}_conv_weight", f"{name}_conv_bias", f"{name}_bn_gamma",
                                     f"{name}_bn_beta"]
    assert graph_of(back)["nodes"][-1]["attrs"]["eps"] == "0.25"
    assert "\\u" not in symbol_json(graph)  # non-ASCII as it is: MXNet reads no \u escape


@pytest.mark.parametrize("name", NAMES)
def test_an_edited_graph_round_trips_through_symbol_files(name, tmp_path):
    """The edited symbol saved as ``-symbol.json`` + ``.params`` and read by SymbolBlock.imports
    computes what the block computes, under the same names."""
    block = _block(name)
    inputs, out = cached_graph(block)
    edited = symbol_from(graph_of(out))
    edited.save(str(tmp_path / "m-symbol.json"))
    mx.nd.save(str(tmp_path / "m-0000.params"), {f"{'aux' if 'moving' in k else 'arg'}:{k}": p.data()
                                                for k, p in block.collect_params().items()})
    back = mx.gluon.SymbolBlock.imports(str(tmp_path / "m-symbol.json"), ["data"], str(tmp_path / "m-0000.params"))
    assert sorted(back.collect_params().keys()) == sorted(block.collect_params().keys())
    assert np.array_equal(back(_x()).asnumpy(), block(_x()).asnumpy())


@pytest.mark.parametrize("hybrid", [False, True])
def test_graph_bn_mode_takes_effect_after_clearing(hybrid):
    """Frozen BatchNorm in a graph normalises a training batch with the running statistics:
    y = gamma * (conv(x) - mean) / sqrt(var + eps) + beta (MXNet's default eps is 1e-3)."""
    name = "bn_é"
    block = _block(name)
    if hybrid:
        block.hybridize()
    with mx.autograd.train_mode():
        block(_x())
    set_graph_bn_modes(block, {f"{name}_bn": True})
    clear_cached_ops(block)
    with mx.autograd.train_mode():
        got = block(_x()).asnumpy()
    p = {k: v.data().asnumpy().astype(np.float64) for k, v in block.collect_params().items()}
    w, b = p[f"{name}_conv_weight"][:, :, 0, 0], p[f"{name}_conv_bias"]
    conv = np.einsum("oc,nchw->nohw", w, _x().asnumpy().astype(np.float64)) + b[None, :, None, None]
    mean, var = (p[f"{name}_bn_moving_{k}"][None, :, None, None] for k in ("mean", "var"))
    want = (p[f"{name}_bn_gamma"][None, :, None, None] * (conv - mean) / np.sqrt(var + 1e-3)
            + p[f"{name}_bn_beta"][None, :, None, None])
    assert_f32_close(got, want, scale=np.abs(conv).max() + 1, terms=2, depth=2)


def test_block_state_is_typed_frozen_and_follows_copies():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=4), mx.gluon.nn.Dense(2, in_units=3))
    net.initialize()
    assert onnx_info(net) is None and lora_record(net) is None
    adapted = add_lora(net, {"0": {"rank": 2, "alpha": 2}})
    record = lora_record(adapted)
    assert list(record.layers) == ["0"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        block_state(adapted).lora = None
    twin = copy_block(adapted)
    assert list(lora_record(twin).layers) == ["0"] and lora_record(twin) is not record  # copied with the block
    merged = merge_adapters(adapted)
    assert lora_record(merged) is None and lora_record(adapted) is record  # the original keeps its adapters
    set_onnx_info(twin, "marker")
    assert onnx_info(twin) == "marker" and onnx_info(adapted) is None and lora_record(twin) is not None


def test_graph_adapters_on_a_non_ascii_node_load_and_merge():
    """Adapters rewrite an imported graph's JSON: a layer named with non-ASCII characters survives,
    and merging gives back the plain graph's output."""
    name = "卷积"
    data = mx.sym.var("data")
    block = mx.gluon.SymbolBlock(mx.sym.Convolution(data, kernel=(1, 1), num_filter=2, name=name), [data])
    block.initialize(mx.init.Uniform(1.0))
    x = _x()
    plain = block(x).asnumpy()  # shapes known
    adapted = add_lora(block, {name: {"rank": 1, "alpha": 1}})
    assert any(n["name"].startswith(name) and "lora" in n["name"] for n in graph_of(cached_graph(adapted)[1])["nodes"])
    assert np.array_equal(adapted(x).asnumpy(), plain)  # B = 0 at the start
    merged = merge_adapters(adapted)
    assert np.array_equal(merged(x).asnumpy(), plain)
    assert cached_graph(merged)[1].tojson() == cached_graph(block)[1].tojson()


def test_trainer_is_set_up_before_its_first_step():
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    net.weight.lr_mult = 0.5
    params = list(net.collect_params().values())
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01})
    assert trainer_params(trainer) == params
    assert init_trainer(trainer) == []
    updaters = trainer_updaters(trainer)
    assert len(updaters) == 1 and updaters[0].states == {}
    opt = updaters[0].optimizer
    assert count_update(opt, 0) == (pytest.approx(0.05), pytest.approx(0.01), 1)  # weight: lr_mult 0.5
    assert count_update(opt, 0)[2] == 2 and count_update(opt, 1) == (pytest.approx(0.1), pytest.approx(0.01), 1)
