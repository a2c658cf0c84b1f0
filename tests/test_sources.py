"""Model sources and selective restore, on real zoo models and real files."""
import socket

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import get_model

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
    np.testing.assert_allclose(blk(x).asnumpy(), ref, rtol=1e-5, atol=1e-6)
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
