"""Readable names for imported graphs: a PyTorch export's ``onnx::Conv_402`` takes the module path the
file records (legacy node names, the dynamo exporter's name scopes), so globs written for the PyTorch
model work on its ONNX export; the graph's own name stays an alias rules match."""
from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import assert_f32_close, run_cli

from gluontl.errors import RuleError
from gluontl.mxinternals import onnx_info
from gluontl.naming import module_names, named_params
from gluontl.onnx import import_model
from gluontl.recipe import Rule
from gluontl.rules import apply_plan, make_plan

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE = (1, 3, 32, 32)


def _load(name):
    return import_model(str(FIXTURES / name), input_shapes={"x": SHAPE})


def _sizes_under(name: str, scope: str) -> dict[str, int]:
    """Float initializers read by a node of the file inside module ``scope``: a legacy node name
    ``/features/features.4/...``, or a dynamo node whose name scopes list ``features.4``."""
    m = onnx.load(str(FIXTURES / name))
    inits = {t.name: int(np.prod(t.dims)) for t in m.graph.initializer if t.data_type == 1 and t.dims}
    out = {}
    for n in m.graph.node:
        scopes = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
        legacy = f"/{scope.split('.')[0]}/{scope}/" if "." in scope else f"/{scope}/"
        inside = n.name.startswith(legacy) or f"'{scope}'" in scopes
        out.update({x: inits[x] for x in n.input if inside and x in inits})
    return out


@pytest.mark.parametrize("file", ["efficientnet_legacy_op13.onnx", "efficientnet_dynamo_op18.onnx"])
def test_module_path_glob_selects_the_block_on_both_exporters(file):
    block = _load(file)
    want = _sizes_under(file, "features.4")
    plan = make_plan(block, [Rule(match=["features.4.*"], grad_req="null")])
    frozen = {r.global_name: r.size for r in plan.rows if not r.trainable}
    assert frozen == want and sum(want.values()) == 10_030
    assert all(r.name.startswith("features.4.") for r in plan.rows if not r.trainable)


def test_legacy_names_and_their_aliases():
    block = _load("efficientnet_legacy_op13.onnx")
    entries = named_params(block)
    # /features/features.4/block/block.3/block.3.0/Conv reads onnx::Conv_207 (weight) and _208 (bias)
    assert entries["features.4.block.3.0.weight"].param.name == "onnx::Conv_207"
    assert entries["onnx::Conv_207"] is entries["features.4.block.3.0.weight"]  # the alias finds it
    assert "onnx::Conv_207" not in list(entries)  # but is not listed twice
    plan = make_plan(block, [Rule(match=["onnx::Conv_207"], lr_mult=0.5)])
    assert [(r.name, r.global_name) for r in plan.rows if r.lr_mult == 0.5] == [
        ("features.4.block.3.0.weight", "onnx::Conv_207")]
    both = make_plan(block, [Rule(match=["features.4.block.3.*", "onnx::Conv_20[78]"], lr_mult=0.5)])
    assert sum(r.lr_mult == 0.5 for r in both.rows) == 2
    assert onnx_info(_load("efficientnet_legacy_op13.onnx")).param_names == onnx_info(block).param_names
    with pytest.raises(RuleError, match=r"matches no parameter \(names look like: features\.0\.0\.weight"):
        make_plan(block, [Rule(match=["features.9.*"], grad_req="null")])


def test_plan_applies_to_renamed_parameters():
    block = _load("resnet_legacy_op13.onnx")
    plan = make_plan(block, [Rule(match=["layer1.*"], grad_req="null")])
    apply_plan(block, plan)
    frozen = {n for n, p in block.collect_params().items() if p.grad_req == "null"}
    assert frozen == set(_sizes_under("resnet_legacy_op13.onnx", "layer1"))
    assert {r.global_name for r in plan.rows if not r.trainable} == frozen


def test_lora_on_a_renamed_layer_freezes_its_base_weights():
    from gluontl.rules import attach_adapters

    block = _load("resnet_legacy_op13.onnx")
    rules = [Rule(match=["layer2.1.conv2.*"], adapter={"rank": 2})]
    block = attach_adapters(block, rules)
    plan = make_plan(block, rules).by_name()
    assert (plan["layer2.1.conv2.weight"].grad_req, plan["layer2.1.conv2.weight"].adapter) == \
        ("null", "base of lora on /layer2/layer2.1/conv2/Conv")
    assert sum(1 for r in plan.values() if r.adapter and r.adapter.startswith("lora_")) == 2


class _Node:
    def __init__(self, name, op_type, inputs, scopes=None):
        self.name, self.op_type, self.input = name, op_type, inputs
        self.metadata_props = [] if scopes is None else [onnx.StringStringEntryProto(
            key="pkg.torch.onnx.name_scopes", value=repr(scopes))]


def test_module_names_reads_both_exporters_and_keeps_real_names():
    nodes = [_Node("/features/features.3/conv/conv.0/Conv", "Conv", ["x", "onnx::Conv_402", "onnx::Conv_403"]),
             _Node("/head/MatMul", "MatMul", ["h", "onnx::MatMul_9"]),
             _Node("/head/Add", "Add", ["m", "head.bias"]),
             _Node("node_linear", "MatMul", ["h2", "val_13"],
                   ["", "blocks", "blocks.0", "blocks.0.attn.qkv", "linear"]),
             _Node("node_expand", "Expand", ["cls_token", "s"], ["", "expand"]),
             _Node("conv0", "Conv", ["x", "w0"]),  # a hand-made graph: no module path recorded
             _Node("/stem/Conv", "Conv", ["x", "onnx::Conv_1"]), _Node("/stem/Conv_1", "Conv", ["x", "onnx::Conv_2"]),
             _Node("/trunk_output/block1/block1-0/proj/proj.0/Conv", "Conv", ["x", "onnx::Conv_7"]),  # torchvision
             _Node("/rnn/LSTM", "LSTM", ["x", "onnx::LSTM_5", "onnx::LSTM_6", "onnx::LSTM_4"])]
    names = ["onnx::Conv_402", "onnx::Conv_403", "onnx::MatMul_9", "head.bias", "val_13", "cls_token", "w0",
             "onnx::Conv_1", "onnx::Conv_2", "onnx::Conv_7", "onnx::LSTM_4", "onnx::LSTM_5", "onnx::LSTM_6"]
    assert module_names(nodes, names) == {
        "onnx::Conv_402": "features.3.conv.0.weight", "onnx::Conv_403": "features.3.conv.0.bias",
        "onnx::MatMul_9": "head.weight", "val_13": "blocks.0.attn.qkv.weight",
        "onnx::Conv_1": "stem.weight", "onnx::Conv_2": "stem.weight_1",  # a collision gets a suffix
        "onnx::Conv_7": "trunk_output.block1.block1-0.proj.0.weight", "onnx::LSTM_4": "rnn.bias",
        "onnx::LSTM_5": "rnn.weight_ih", "onnx::LSTM_6": "rnn.weight_hh"}


def test_inspect_lists_parameters_and_cut_points_near_the_classifier(capsys):
    path = str(FIXTURES / "efficientnet_legacy_op13.onnx")
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.split() == ["features.4.block.3.0.weight", "onnx::Conv_207", "40x96x1x1", "3,840", "Conv", "2"]
               for line in lines)
    cuts = lines[lines.index(next(l for l in lines if l.startswith("cut points"))) + 1:
                 lines.index(next(l for l in lines if l.startswith("parameters (")))]
    assert [c.split()[0] for c in cuts][-2:] == ["/ReduceMean", "/classifier/classifier.1/Gemm"]
    assert not any("features.0" in c for c in cuts)  # not the stem
    code, out, err = run_cli(capsys, "inspect", path, "--json")
    assert code == 0, err
    data = json.loads(out)
    row = next(p for p in data["params"] if p["global_name"] == "onnx::Conv_207")
    assert (row["name"], row["shape"], row["layer_type"]) == ("features.4.block.3.0.weight", [40, 96, 1, 1], "Conv")
    assert data["report"]["cut_points"][-1] == ["/classifier/classifier.1/Gemm", "Gemm", "y"]
    assert len(data["params"]) == 44


def test_inspect_json_on_an_onnx_file_with_open_sizes_says_why_no_parameters(capsys):
    code, out, err = run_cli(capsys, "inspect", str(FIXTURES / "resnet_legacy_op13_dynhw.onnx"), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["params"] is None and "--input-shape" in data["params_note"]
    code, out, err = run_cli(capsys, "inspect", str(FIXTURES / "resnet_legacy_op13_dynhw.onnx"), "--json",
                        "--input-shape", "x=1,3,32,32")
    assert code == 0, err
    assert [p["name"] for p in json.loads(out)["params"]][:2] == ["conv1.weight", "conv1.bias"]


def test_frozen_prefix_of_a_renamed_graph_ends_where_the_plan_says():
    """The feature cache reads the plan by the graph's own names: the prefix ends before the first
    node reading a trainable parameter, named as the plan names it."""
    from gluontl.data.prefix import split_frozen_prefix

    block = _load("resnet_legacy_op13.onnx")
    plan = make_plan(block, [Rule(match=["conv1.*", "layer1.*"], grad_req="null")])
    split = split_frozen_prefix(block, plan, (3, 32, 32), mx.cpu())
    assert split.boundary == "/layer1/layer1.1/Relu_1" and split.reason.endswith(
        "node /layer2/layer2.0/conv1/Conv trains (layer2.0.conv1.weight has grad_req write)")
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32))
    # the same convolutions split in two graphs: equal up to float32 sums of <= 288 products, 6 deep
    assert_f32_close(split.suffix(split.prefix(x)).asnumpy(), block(x).asnumpy(), terms=288, depth=6)
