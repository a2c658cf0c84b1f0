"""Model sources and selective restore, on real zoo models and real files."""
import socket

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import get_model
from tests.helpers import assert_f32_close

from gluontl.errors import ModelSourceError, RestoreError
from gluontl.naming import named_params
from gluontl.recipe import ModelSpec
from gluontl.sources import build_model, load_model, restore, zoo_names

SHAPE = (3, 32, 32)


def _saved(tmp_path, name="resnet18_v1", classes=5):
    net = get_model(name, classes=classes)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, *SHAPE)))
    path = tmp_path / f"{name}.params"
    net.save_parameters(str(path))
    return net, path


def test_structural_names_match_save_parameters(tmp_path):
    net, path = _saved(tmp_path)
    assert list(named_params(net)) == list(mx.nd.load(str(path)))
    assert "features.7.1.body.4.running_var" in named_params(net)


def test_restore_reports_all_four_cases(tmp_path):
    src, path = _saved(tmp_path)
    arrays = mx.nd.load(str(path))
    arrays.pop("features.0.weight")  # missing in file
    arrays["extra.weight"] = mx.nd.ones((3,))  # unexpected
    arrays["output.weight"] = mx.nd.ones((7, 512))  # shape mismatch
    crafted = tmp_path / "crafted.params"
    mx.nd.save(str(crafted), arrays)
    dst = load_model("zoo:resnet18_v1", classes=5)
    dst(mx.nd.zeros((1, *SHAPE)))
    before = named_params(dst)["features.0.weight"].param.data().asnumpy().copy()
    rep = restore(dst, crafted)
    assert rep.missing == ["features.0.weight"]
    assert rep.unexpected == ["extra.weight"]
    assert rep.mismatched == [("output.weight", (5, 512), (7, 512))]
    assert len(rep.restored) == len(arrays) - 2
    p = named_params(dst)
    np.testing.assert_array_equal(p["features.7.1.body.0.weight"].param.data().asnumpy(),
                                  arrays["features.7.1.body.0.weight"].asnumpy())
    np.testing.assert_array_equal(p["features.0.weight"].param.data().asnumpy(), before)
    with pytest.raises(RestoreError) as e:
        rep.check()
    msg = str(e.value)
    assert "features.0.weight" in msg and "extra.weight" in msg and "output.weight model (5, 512) file (7, 512)" in msg
    rep.check(expect_missing=["features.0.*"], expect_unexpected=["extra.*"], expect_mismatch=["output.*"])


def test_restore_with_prefix_map_and_only(tmp_path):
    src, path = _saved(tmp_path)
    arrays = {("backbone." + k[len("features."):] if k.startswith("features.") else k): v
              for k, v in mx.nd.load(str(path)).items()}
    renamed = tmp_path / "renamed.params"
    mx.nd.save(str(renamed), arrays)
    dst = load_model("zoo:resnet18_v1", classes=5)
    dst(mx.nd.zeros((1, *SHAPE)))
    rep = restore(dst, renamed, prefix_map={"features.": "backbone."}, only=["features.*"])
    assert rep.missing == [] and rep.mismatched == [] and rep.unexpected == []
    assert len(rep.restored) == 100
    rep = restore(dst, renamed)  # without the map nothing in features matches
    assert "features.0.weight" in rep.missing and "backbone.0.weight" in rep.unexpected


def test_build_model_new_head_restores_backbone_and_reinitializes_head(tmp_path):
    src, path = _saved(tmp_path, classes=10)
    spec = ModelSpec(source="zoo:resnet18_v1", weights=str(path), input_shape=SHAPE,
                     restore={"expect_mismatch": ["output.*"]})
    net, rep = build_model(spec, classes=3)
    assert rep.not_restored() == ["output.weight", "output.bias"]
    s, d = named_params(src), named_params(net)
    np.testing.assert_array_equal(s["features.4.0.body.0.weight"].param.data().asnumpy(),
                                  d["features.4.0.body.0.weight"].param.data().asnumpy())
    assert d["output.weight"].param.shape == (3, 512)
    assert np.abs(d["output.bias"].param.data().asnumpy()).max() == 0  # xavier: bias zero
    with pytest.raises(RestoreError, match="expect_mismatch"):
        build_model(spec.model_copy(update={"restore": spec.restore.model_copy(update={"expect_mismatch": []})}),
                    classes=3)


def test_symbol_source_round_trip(tmp_path):
    net, _ = _saved(tmp_path)
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, *SHAPE))
    with mx.autograd.predict_mode():
        ref = net(x).asnumpy()
    net.export(str(tmp_path / "m"), epoch=3)
    blk = load_model(ModelSpec(source=f"symbol:{tmp_path / 'm'}"))
    assert_f32_close(blk(x).asnumpy(), ref, terms=512 * 9, depth=17)  # resnet18: 17 convs, ≤ 512·3·3 sums
    names = named_params(blk)
    assert "resnetv10_conv0_weight" in names or any(n.endswith("conv0_weight") for n in names)
    # exported files carry arg:/aux: prefixes and global names; restore reads them by those names
    rep = restore(blk, tmp_path / "m-0003.params")
    assert len(rep.restored) == len(names) and not rep.missing and not rep.unexpected


def test_zoo_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(ModelSourceError, match=r"not a Gluon or GluonCV.*resnet18_v1"):
        load_model("zoo:resnet18_vl")
    # The real download code, run offline deterministically: an empty model cache and a zoo
    # repository on a local port that is bound but not listening (connections are refused).
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MXNET_HOME", str(tmp_path))
        monkeypatch.setenv("MXNET_GLUON_REPO", f"http://127.0.0.1:{closed.getsockname()[1]}/")
        with pytest.raises(ModelSourceError, match=r"Downloading pretrained weights for "
                                                   r"'squeezenet1.0' failed \(ConnectionError"):
            load_model(ModelSpec(source="zoo:squeezenet1.0", pretrained=True))
        assert list(tmp_path.iterdir()) == []  # no .lock, no partial .zip, no empty models/ folder
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "mine.params").write_bytes(b"x")
        with pytest.raises(ModelSourceError, match="Downloading pretrained weights"):
            load_model(ModelSpec(source="zoo:squeezenet1.0", pretrained=True))
        assert [p.name for p in (tmp_path / "models").iterdir()] == ["mine.params"]  # what was there stays
    with pytest.raises(ModelSourceError, match="does not exist"):
        load_model(ModelSpec(source="symbol:/nonexistent/model"))


def test_every_gluon_vision_name_is_in_the_zoo():
    from mxnet.gluon.model_zoo import vision
    import inspect
    src = inspect.getsource(vision.get_model)
    gluon = {line.split("'")[1] for line in src.splitlines() if line.strip().startswith("'") and "':" in line}
    assert len(gluon) > 30
    assert gluon <= set(zoo_names())


@pytest.mark.parametrize("damage", ["json_garbage", "json_truncated", "params_truncated", "params_foreign",
                                    "params_missing_weight"])
def test_broken_symbol_checkpoints_give_clean_errors(tmp_path, damage):
    net, _ = _saved(tmp_path)
    net.hybridize()
    net(mx.nd.zeros((1, *SHAPE)))
    prefix = tmp_path / "m"
    net.export(str(prefix))
    sym, params = tmp_path / "m-symbol.json", tmp_path / "m-0000.params"
    if damage == "json_garbage":
        sym.write_text("{not json")
    elif damage == "json_truncated":
        sym.write_text(sym.read_text()[:500])
    elif damage == "params_truncated":
        params.write_bytes(params.read_bytes()[:1000])
    elif damage == "params_foreign":
        params.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    else:
        arrays = mx.nd.load(str(params))
        arrays.pop(next(k for k in arrays if k.endswith("conv0_weight")))
        mx.nd.save(str(params), arrays)
    with pytest.raises(ModelSourceError) as e:
        load_model(ModelSpec(source=f"symbol:{prefix}"))
    assert str(tmp_path) in str(e.value)


# ------------------------------------------------------------ selective restore: the finer points


def _two_layer():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 5)))
    return net


def _ramp(shape, start=0.0, dtype="float32"):
    return mx.nd.array(start + np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / 8, dtype=dtype)


def test_restore_reads_exported_global_names_and_prefers_structural_ones(tmp_path):
    # export() writes arg:/aux: + global names (resnetv10_conv0_weight); a Gluon block restores
    # them by its parameters' global names when its structural names are not in the file
    net = get_model("resnet18_v1", classes=5)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *SHAPE)))
    net.export(str(tmp_path / "m"))
    want = {n: e.param.data().asnumpy().copy() for n, e in named_params(net).items()}
    for e in named_params(net).values():
        e.param.set_data(mx.nd.zeros(e.param.shape))
    rep = restore(net, tmp_path / "m-0000.params")
    assert rep.restored == list(want) and not rep.missing and not rep.unexpected and not rep.mismatched
    for n, e in named_params(net).items():
        np.testing.assert_array_equal(e.param.data().asnumpy(), want[n], err_msg=n)
    # a file holding a parameter under both names: the structural name wins, the global one is unexpected
    arrays = mx.nd.load(str(tmp_path / "m-0000.params"))
    arrays["output.bias"] = mx.nd.full((5,), 7.0)
    mx.nd.save(str(tmp_path / "both.params"), arrays)
    glob_name = named_params(net)["output.bias"].param.name
    rep = restore(net, tmp_path / "both.params")
    assert rep.unexpected == [glob_name] and "output.bias" in rep.restored
    np.testing.assert_array_equal(named_params(net)["output.bias"].param.data().asnumpy(), np.full(5, 7.0))


def test_restore_only_skips_names_anywhere_in_the_model(tmp_path):
    net = _two_layer()
    arrays = {n: _ramp(e.param.shape, 1.0) for n, e in named_params(net).items()}
    mx.nd.save(str(tmp_path / "w.params"), arrays)
    before = {n: e.param.data().asnumpy().copy() for n, e in named_params(net).items()}
    rep = restore(net, tmp_path / "w.params", only=["0.weight", "1.*"])  # 0.bias, between them, is skipped
    assert rep.restored == ["0.weight", "1.weight", "1.bias"] and rep.missing == []
    p = named_params(net)
    np.testing.assert_array_equal(p["0.bias"].param.data().asnumpy(), before["0.bias"])
    for n in rep.restored:
        np.testing.assert_array_equal(p[n].param.data().asnumpy(), arrays[n].asnumpy())


def test_restore_prefix_map_longest_prefix_wins(tmp_path):
    net = mx.gluon.nn.HybridSequential()
    body = mx.gluon.nn.HybridSequential()
    body.add(mx.gluon.nn.Dense(4), mx.gluon.nn.Dense(4))
    net.add(body, mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 5)))
    arrays = {"body.0.weight": _ramp((4, 5), 1.0), "body.0.bias": _ramp((4,), 2.0),
              "special.weight": _ramp((4, 4), 3.0), "special.bias": _ramp((4,), 4.0),
              "1.weight": _ramp((3, 4), 5.0), "1.bias": _ramp((3,), 6.0)}
    mx.nd.save(str(tmp_path / "w.params"), arrays)
    # "0.1.weight" starts with both prefixes: the longer one decides, whatever the dict's order
    rep = restore(net, tmp_path / "w.params", prefix_map={"0.": "body.", "0.1.": "special."})
    assert not rep.missing and not rep.unexpected and not rep.mismatched, rep.lines()
    np.testing.assert_array_equal(named_params(net)["0.1.bias"].param.data().asnumpy(),
                                  arrays["special.bias"].asnumpy())


def test_restore_casts_to_the_parameters_dtype(tmp_path):
    net = _two_layer()
    arrays = {n: _ramp(e.param.shape, 0.5, dtype="float64") for n, e in named_params(net).items()}
    mx.nd.save(str(tmp_path / "w64.params"), arrays)
    rep = restore(net, tmp_path / "w64.params")
    assert rep.file == str(tmp_path / "w64.params") and len(rep.restored) == 4
    for n, e in named_params(net).items():
        assert e.param.data().dtype == np.float32
        np.testing.assert_array_equal(e.param.data().asnumpy(), arrays[n].asnumpy().astype(np.float32))


def test_read_params_file_strips_only_the_export_prefix(tmp_path):
    from gluontl.sources.restore import read_params_file

    mx.nd.save(str(tmp_path / "w.params"), {"arg:conv:0_weight": mx.nd.ones(2), "aux:bn_var": mx.nd.ones(1),
                                            "plain:x": mx.nd.ones(3)})
    assert sorted(read_params_file(tmp_path / "w.params")) == ["bn_var", "conv:0_weight", "plain:x"]


def test_unusable_weight_files_are_clear_errors(tmp_path):
    net = _two_layer()
    missing = tmp_path / "nope.params"
    with pytest.raises(ModelSourceError, match=rf"Weights file '{missing}' does not exist\. Check model\.weights"):
        restore(net, missing)
    foreign = tmp_path / "foreign.params"
    foreign.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(ModelSourceError) as e:
        restore(net, foreign)
    msg = str(e.value)
    assert msg.startswith(f"Weights file '{foreign}' is not a readable MXNet .params file (")
    assert "Invalid NDArray file format" in msg and msg.endswith("). Re-save it with save_parameters.")
    unnamed = tmp_path / "list.params"
    mx.nd.save(str(unnamed), [mx.nd.ones(2)])
    with pytest.raises(ModelSourceError, match=rf"Weights file '{unnamed}' holds an unnamed list of arrays"):
        restore(net, unnamed)


def _report(n_missing, n_mismatch):
    from gluontl.sources.restore import RestoreReport

    return RestoreReport(file="w.params", restored=["a.weight"],
                         missing=[f"m{i}.weight" for i in range(n_missing)], unexpected=["x.w", "y.w"],
                         mismatched=[(f"head{i}.fc.weight", (i + 1, 2), (i + 2, 2)) for i in range(n_mismatch)])


def test_restore_report_lines_and_the_check_message():
    rep = _report(2, 1)
    assert rep.lines() == ["restored 1 from w.params; missing 2, unexpected 2, shape mismatch 1",
                           "  missing in file: m0.weight", "  missing in file: m1.weight",
                           "  unexpected in file: x.w", "  unexpected in file: y.w",
                           "  shape mismatch: head0.fc.weight model (1, 2) file (2, 2)"]
    assert rep.not_restored() == ["m0.weight", "m1.weight", "head0.fc.weight"]
    with pytest.raises(RestoreError) as e:
        rep.check()
    assert str(e.value) == (
        "Restoring 'w.params' left names the recipe did not expect — missing in the file: m0.weight, m1.weight "
        "(declare with expect_missing); in the file but not in the model: x.w, y.w (declare with "
        "expect_unexpected, or map names with prefix_map); shape mismatch: head0.fc.weight model (1, 2) file "
        "(2, 2) (a new head? declare with expect_mismatch, e.g. ['head0.fc.*']). Add the globs under "
        "model.restore in the recipe if these are intended; otherwise the file does not belong to this model.")


def test_check_message_shortens_long_lists():
    rep = _report(6, 5)  # six missing and five mismatched: all shown
    with pytest.raises(RestoreError) as e:
        rep.check(expect_unexpected=["*"])
    msg = str(e.value)
    assert "m0.weight, m1.weight, m2.weight, m3.weight, m4.weight, m5.weight (declare" in msg
    assert "head4.fc.weight model (5, 2) file (6, 2) (a new head?" in msg
    assert "shape mismatch: head0.fc.weight model (1, 2) file (2, 2), head1.fc.weight model (2, 2) file (3, 2), " in msg
    rep = _report(7, 6)  # one more of each: the lists are cut
    with pytest.raises(RestoreError) as e:
        rep.check(expect_unexpected=["*"])
    msg = str(e.value)
    assert "m5.weight … (7 in all) (declare with expect_missing)" in msg and "m6.weight" not in msg
    assert "head4.fc.weight model (5, 2) file (6, 2) … (a new head?" in msg and "head5" not in msg


def test_check_globs_excuse_only_their_own_kind():
    # a glob under expect_missing does not excuse a shape mismatch of the same name (nor the reverse)
    from gluontl.sources.restore import RestoreReport

    rep = RestoreReport(file="w.params", missing=["head.bias"], mismatched=[("head.weight", (5, 8), (9, 8))])
    with pytest.raises(RestoreError, match=r"shape mismatch: head\.weight model \(5, 8\) file \(9, 8\)") as e:
        rep.check(expect_missing=["head.*"])
    assert "missing in the file" not in str(e.value)
    with pytest.raises(RestoreError, match=r"missing in the file: head\.bias") as e:
        rep.check(expect_mismatch=["head.*"], expect_unexpected=["head.*"])
    assert "shape mismatch" not in str(e.value)
    rep = RestoreReport(file="w.params", unexpected=["head.weight"])
    with pytest.raises(RestoreError, match=r"in the file but not in the model: head\.weight"):
        rep.check(expect_missing=["head.*"], expect_mismatch=["head.*"])
    rep.check(expect_unexpected=["head.*"])


def test_snapshot_is_a_copy():
    from gluontl.sources.restore import snapshot

    net = _two_layer()
    snap = snapshot(net)
    assert list(snap) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    w = named_params(net)["0.weight"].param
    old = w.data().asnumpy().copy()
    w.set_data(w.data() + 1)
    np.testing.assert_array_equal(snap["0.weight"], old)


def test_build_model_expect_missing_does_not_excuse_a_new_head(tmp_path):
    _, path = _saved(tmp_path, classes=10)
    spec = ModelSpec(source="zoo:resnet18_v1", weights=str(path), input_shape=SHAPE,
                     restore={"expect_missing": ["output.*"], "expect_unexpected": ["output.*"]})
    with pytest.raises(RestoreError, match=r"shape mismatch: output\.weight model \(3, 512\) file \(10, 512\)"):
        build_model(spec, classes=3)
