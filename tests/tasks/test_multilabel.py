"""task: multilabel — AP and thresholds against scikit-learn and brute force, BCE against numpy, the
label sources and their bad input, and a tiny run end to end: cached training, evaluate (and its
flip TTA against hand-flipped views), predict, and the ONNX export's probabilities, thresholds and
baked flip against MXNet and onnxruntime."""
from __future__ import annotations

import csv
import json

import mxnet as mx
import numpy as np
import onnx
import pytest
import yaml
from PIL import Image

from gluontl.tasks.multilabel import META_THRESHOLDS, average_precision, bce_loss, best_threshold, ranking_metrics
from tests import helpers

COLOURS = ("red", "green", "blue")


def test_average_precision_is_sklearns_per_class_macro_and_micro():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = (rng.random((60, 4)) < [0.1, 0.3, 0.5, 0.8]).astype(np.int64)
    probs = np.round(rng.random((60, 4)) * 0.5 + labels * 0.3, 1)  # rounded: many ties
    got = ranking_metrics(probs, labels)
    want = metrics.average_precision_score(labels, probs, average=None)
    np.testing.assert_allclose(got["ap"], want, rtol=1e-12)
    assert got["val_macro_map"] == pytest.approx(metrics.average_precision_score(labels, probs, average="macro"))
    assert got["val_micro_map"] == pytest.approx(metrics.average_precision_score(labels, probs, average="micro"))
    assert np.isnan(average_precision(probs[:, 0], np.zeros(60)))  # no positive: no AP (left out of the mean)


def test_best_threshold_is_the_brute_force_maximum_of_f1():
    rng = np.random.default_rng(1)
    for trial in range(20):
        y = (rng.random(40) < 0.4).astype(np.int64)
        s = np.round(rng.random(40), 2)
        if not y.any():
            continue
        best = max(((2 * np.sum((s >= t) & (y == 1)) / (np.sum(s >= t) + y.sum()), t) for t in np.unique(s)))
        t, f1 = best_threshold(s, y)
        assert f1 == pytest.approx(best[0])
        pred = s >= t
        assert 2 * np.sum(pred & (y == 1)) / (pred.sum() + y.sum()) == pytest.approx(f1)


def test_bce_with_pos_weight_is_the_numpy_formula():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 3, (5, 3)).astype(np.float32)
    y = (rng.random((5, 3)) < 0.5).astype(np.float32)
    pw = np.array([1.0, 3.0, 0.5], np.float32)
    p = 1 / (1 + np.exp(-z.astype(np.float64)))
    want = np.mean(-(pw * y * np.log(p) + (1 - y) * np.log1p(-p)), axis=1)
    got = bce_loss(pw)(mx.nd.array(z), mx.nd.array(y)).asnumpy()
    helpers.assert_f32_close(got, want, scale=np.abs(want).max(), terms=6)
    plain = np.mean(-(y * np.log(p) + (1 - y) * np.log1p(-p)), axis=1)
    helpers.assert_f32_close(bce_loss(None)(mx.nd.array(z), mx.nd.array(y)).asnumpy(), plain,
                             scale=np.abs(plain).max(), terms=6)


# ---------------------------------------------------------------- data

def _colour_sets(root, n=40):
    """16x16 noise images; each has a seeded subset of {red, green, blue} brightened: its labels."""
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        on = [c for c in COLOURS if rng.random() < 0.5]
        rgb = rng.integers(0, 90, (16, 16, 3)).astype(np.uint8)
        for c in on:
            rgb[..., COLOURS.index(c)] += 150
        (root / "img").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgb).save(root / "img" / f"{i:02d}.png")
        rows.append((f"img/{i:02d}.png", on))
    with open(root / "labels.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "labels"])
        w.writerows([(p, ";".join(on)) for p, on in rows])
    return rows


def _spec(source, **more):
    from gluontl.recipe import DataSpec

    return DataSpec(source=source, batch_size=6, val_fraction=0.25, train_transform={"normalize": "none"},
                    val_transform={"normalize": "none"}, **more)


def test_csv_json_and_label_folders_give_the_same_multi_hot_rows(tmp_path):
    from gluontl.data.datasets import load_split

    rows = _colour_sets(tmp_path)
    (tmp_path / "labels.json").write_text(json.dumps([{"image": p, "labels": on} for p, on in rows]))
    for p, on in rows:
        for c in on:
            (tmp_path / "folders" / c).mkdir(parents=True, exist_ok=True)
            (tmp_path / "folders" / c / p.split("/")[1]).write_bytes((tmp_path / p).read_bytes())
    got = {}
    for src in ("labels.csv", "labels.json", "folders"):
        sets = [load_split(_spec(f"labels:{tmp_path / src}"), s) for s in ("train", "val")]
        got[src] = {ds.name(i).rsplit("/", 1)[1]: tuple(ds[i][1]) for ds in sets for i in range(len(ds))}
        assert sets[0].class_names == sorted(COLOURS)
    with_label = {p.split("/")[1]: tuple(float(c in on) for c in sorted(COLOURS)) for p, on in rows if on}
    assert got["labels.csv"] == got["labels.json"] == {**{p.split("/")[1]: (0.0,) * 3 for p, _ in rows}, **with_label}
    assert got["folders"] == with_label  # label folders cannot hold an image without a label


def _recipe(prefix, source, **train):
    return {"name": "ml", "task": "multilabel",
            "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]},
            "surgery": {"drop_last": 1, "head": {"classes": 3}},
            "rules": [{"match": "*", "grad_req": "null"}, {"match": ["conv1*", "head.*"], "grad_req": "write"}],
            "data": {"source": source, "batch_size": 6, "val_fraction": 0.25,
                     "train_transform": {"normalize": "none"}, "val_transform": {"normalize": "none"}},
            "train": {"epochs": 8, "lr": 0.05, "optimizer": "adam", "seed": 0, "hybridize": False, **train},
            "export": {"formats": ["onnx"]}}


@pytest.mark.parametrize("edit, needles", [
    (lambda rows: [["image", "labels"], *rows, ["img/00.png", "red"]], ["labels.csv, line 42", "img/00.png",
                                                                        "listed twice"]),
    (lambda rows: [["image", "tags"], *rows], ["labels.csv, line 1", "labels column"]),
    (lambda rows: [["image", "labels"], *rows[:-1], [rows[-1][0], "purple"]], ["labels.csv, line 41", "purple",
                                                                               "unknown label"]),
])
def test_bad_label_files_exit_2_naming_file_line_and_key(tmp_path, capsys, edit, needles):
    rows = _colour_sets(tmp_path)
    with open(tmp_path / "labels.csv", newline="") as fh:
        body = list(csv.reader(fh))[1:]
    with open(tmp_path / "labels.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(edit(body))
    recipe = _recipe(helpers.tiny_symbol(tmp_path), f"labels:{tmp_path / 'labels.csv'}")
    recipe["data"]["classes"] = list(COLOURS)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs",
                                     str(tmp_path / "runs"))
    helpers.assert_one_paragraph(code, out, err, [str(tmp_path / "labels.csv"), *needles])
    assert len(rows) == 40


# ---------------------------------------------------------------- a tiny run, end to end

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from gluontl.recipe import parse_recipe
    from gluontl.train.loop import finetune

    root = tmp_path_factory.mktemp("ml")
    _colour_sets(root)
    recipe = parse_recipe(_recipe(helpers.tiny_symbol(root), f"labels:{root / 'labels.csv'}", cache_features="on"))
    return finetune(recipe, runs_root=root / "runs", quiet=True), root


def _val_probs(run_dir, view=lambda x: x):
    """sigmoid(net(view(x))) over the val split, by hand from the loaded checkpoint."""
    from gluontl.data.datasets import load_split
    from gluontl.train.runs import load_run

    recipe, net = load_run(run_dir)
    ds = load_split(recipe.data, "val")
    x = np.stack([ds[i][0] for i in range(len(ds))])
    with mx.autograd.predict_mode():
        return mx.nd.sigmoid(net(mx.nd.array(view(x)))).asnumpy().astype(np.float64), x, net


def test_a_tiny_run_trains_from_cached_features_and_evaluates_its_table(run):
    from gluontl.train.runs import evaluate_report

    result, _ = run
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "val_macro_map" in r]
    assert len(epochs) == 8 and epochs[-1]["val_macro_map"] > epochs[0]["val_macro_map"]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["feature_cache"] and "on" in json.dumps(summary["feature_cache"])
    report = evaluate_report(result.run_dir)
    assert report.values["from_feature_cache"]
    probs, _, _ = _val_probs(result.run_dir)
    helpers.assert_f32_close(report.values["probs"], probs, scale=1.0, terms=200, depth=4)
    assert report.values["val_macro_map"] == pytest.approx(ranking_metrics(probs, report.values["labels"])
                                                           ["val_macro_map"], abs=1e-3)
    assert report.lines[1].split() == ["class", "AP", "threshold", "F1", "support"]
    assert [line.split()[0] for line in report.lines[2:5]] == sorted(COLOURS)


def test_one_label_file_records_its_split_and_evaluate_uses_exactly_that_split(run):
    """split.json lists the held-out images of a single labels.csv (counts: images per label, from the
    CSV by hand), and evaluate (like predict's thresholds, export and resume, through load_split) sees
    exactly those images, in that order, with their CSV labels."""
    from gluontl.data.datasets import load_split
    from gluontl.recipe import load_recipe
    from gluontl.train.runs import evaluate

    result, root = run
    record = json.loads((result.run_dir / "split.json").read_text())
    assert (record["source"], record["method"], record["val_fraction"]) == (f"labels:{root / 'labels.csv'}",
                                                                           "stratified_holdout", 0.25)
    with open(root / "labels.csv", newline="") as fh:
        listed = {str(root / r["image"]): [float(c in r["labels"].split(";")) for c in sorted(COLOURS)]
                  for r in csv.DictReader(fh)}
    val = record["val"]
    assert 0 < len(val) < len(listed) and len(set(val)) == len(val) and set(val) <= set(listed)
    parts = {"train": [p for p in listed if p not in val], "val": val}
    assert record["counts"] == {w: {c: int(sum(listed[p][k] for p in ps)) for k, c in enumerate(sorted(COLOURS))}
                                for w, ps in parts.items()}
    ds = load_split(load_recipe(result.run_dir / "recipe.yaml").data, "val")
    assert [ds.name(i) for i in range(len(ds))] == val
    got = evaluate(result.run_dir)
    assert got["images"] == len(val)
    np.testing.assert_array_equal(got["labels"], [listed[p] for p in val])


def test_plan_prints_the_automatic_split_of_one_label_file(run, capsys):
    result, _ = run
    code, out, _ = helpers.run_cli(capsys, "plan", "-r", str(result.run_dir / "recipe.yaml"))
    record = json.loads((result.run_dir / "split.json").read_text())
    pairs = ", ".join(f"{c} {n}/{record['counts']['val'][c]}" for c, n in record["counts"]["train"].items())
    assert code == 0 and f"train {40 - len(record['val'])} images, val {len(record['val'])}" in out
    assert f"images per class (train/val): {pairs}" in out


def test_evaluate_tta_flip_is_the_mean_of_the_two_single_views(run):
    from gluontl.train.runs import evaluate

    result, _ = run
    plain, _, _ = _val_probs(result.run_dir)
    mirrored, _, _ = _val_probs(result.run_dir, lambda x: x[..., ::-1])
    got = evaluate(result.run_dir, tta="flip")
    helpers.assert_f32_close(got["probs"], (plain + mirrored) / 2, scale=1.0, terms=200, depth=4)
    assert got["val_macro_map"] == pytest.approx(ranking_metrics((plain + mirrored) / 2, got["labels"])
                                                 ["val_macro_map"], abs=1e-3)


def test_predict_and_the_onnx_export_agree_on_probabilities_and_thresholds(run, tmp_path):
    from gluontl.train.runs import evaluate, export_run, predict

    result, root = run
    out = tmp_path / "export"
    export_run(result.run_dir, out)
    model = onnx.load(str(out / "ml.onnx"))
    meta = {p.key: p.value for p in model.metadata_props}
    thresholds = evaluate(result.run_dir)["thresholds"]
    assert json.loads(meta[META_THRESHOLDS]) == pytest.approx(thresholds, abs=1e-6)
    assert meta["gluontl.task"] == "multilabel"
    probs, x, _ = _val_probs(result.run_dir)
    (ort,) = helpers.ort_run(model.SerializeToString(), {model.graph.input[0].name: x.astype(np.float32)})
    assert np.max(np.abs(ort - probs)) <= 1e-4  # probabilities, not logits
    images = [str(root / "img" / "00.png"), str(root / "img" / "01.png")]
    from_run, from_file = predict(result.run_dir, images), predict(out / "ml.onnx", images)
    for a, b in zip(from_run, from_file):
        assert a["labels"] == b["labels"]
        assert a["probs"] == pytest.approx(b["probs"], abs=1e-4)
        assert a["labels"] == [n for n, t in zip(sorted(COLOURS), thresholds) if a["probs"][n] >= t]


def test_export_tta_flip_bakes_the_mirror_average_into_the_graph(run, tmp_path):
    from gluontl.train.runs import export_run

    result, _ = run
    export_run(result.run_dir, tmp_path / "plain")
    recipe = yaml.safe_load((result.run_dir / "recipe.yaml").read_text())
    recipe["export"]["tta"] = "flip"
    (result.run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    try:
        export_run(result.run_dir, tmp_path / "flip")
    finally:
        recipe["export"]["tta"] = "none"
        (result.run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    x = np.random.default_rng(3).normal(0, 1, (3, 3, 16, 16)).astype(np.float32)
    plain = onnx.load(str(tmp_path / "plain" / "ml.onnx")).SerializeToString()
    flip = onnx.load(str(tmp_path / "flip" / "ml.onnx"))
    name = flip.graph.input[0].name
    want = (helpers.ort_run(plain, {name: x})[0] + helpers.ort_run(plain, {name: x[..., ::-1].copy()})[0]) / 2
    helpers.assert_f32_close(helpers.ort_run(flip.SerializeToString(), {name: x})[0], want, scale=1.0, terms=4)
    assert {p.key: p.value for p in flip.metadata_props}["gluontl.tta"] == "flip"


def _images(root):
    return [str(root / "img" / f"{i:02d}.png") for i in range(4)]


def _sklearn_macro_map(probs, labels) -> float:
    return float(pytest.importorskip("sklearn.metrics").average_precision_score(labels, probs, average="macro"))


def test_the_openvino_ir_answers_mxnets_probabilities_with_the_thresholds_in_its_runtime_info(run, tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'gluontl[openvino]')")
    from openvino import Core

    from gluontl.train.runs import evaluate, export_run, predict

    result, root = run
    out = tmp_path / "ir"
    written = export_run(result.run_dir, out, formats=["onnx", "openvino"], echo=lambda _: None)
    model = Core().read_model(str(out / "ml-openvino" / "ml.xml"))
    info = model.get_rt_info()
    meta = {str(k): info[k].astype(str) for k in info.keys() if str(k).startswith("gluontl.")}
    onnx_meta = {p.key: p.value for p in onnx.load(str(out / "ml.onnx")).metadata_props}
    assert {k: meta.get(k) for k in onnx_meta} == onnx_meta  # the ONNX keys, thresholds and classes among them
    assert json.loads(meta[META_THRESHOLDS]) == pytest.approx(evaluate(result.run_dir)["thresholds"], abs=1e-6)
    probs, x, _ = _val_probs(result.run_dir)
    net = Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = np.asarray(net(x.astype(np.float32))[net.outputs[0]], np.float64)
    assert np.max(np.abs(got - probs)) <= 1e-4  # probabilities (MXNet's sigmoid), not logits
    verdict = next(a.verdict for a in written.artifacts if a.format == "openvino")
    assert "macro mAP" in verdict and "+0.000 points" in verdict  # judged on the val split like top-1 for one label
    from_run, from_ir = predict(result.run_dir, _images(root)), predict(out / "ml-openvino", _images(root))
    for a, b in zip(from_run, from_ir):
        assert a["labels"] == b["labels"] and a["probs"] == pytest.approx(b["probs"], abs=1e-4)


def test_int8_onnx_and_symbol_are_judged_by_macro_map_as_sklearn_computes_it(run, tmp_path):
    from gluontl.train.runs import evaluate, export_run, predict

    result, root = run
    out = tmp_path / "int8"
    quantize = {"calibration": "val", "max_drop": 100}
    written = export_run(result.run_dir, out, export={"formats": ["onnx", "symbol"], "quantize": quantize},
                         echo=lambda _: None)
    assert not written.refused
    probs, x, _ = _val_probs(result.run_dir)
    labels = evaluate(result.run_dir)["labels"]
    float_model, int8_model = (onnx.load(str(out / f)) for f in ("ml.onnx", "ml.int8.onnx"))
    name = float_model.graph.input[0].name
    p_float, p_int8 = (np.asarray(helpers.ort_run(m.SerializeToString(), {name: x})[0], np.float64)
                       for m in (float_model, int8_model))
    meta = {p.key: p.value for p in int8_model.metadata_props}
    thresholds = np.asarray(json.loads(meta[META_THRESHOLDS]))
    report = json.loads((result.run_dir / "ml.int8.json").read_text())["verification"]
    assert report["metric"] == "macro mAP" and report["images"] == len(labels)
    assert report["float"] == pytest.approx(_sklearn_macro_map(p_float, labels), abs=1e-6)
    assert report["int8"] == pytest.approx(_sklearn_macro_map(p_int8, labels), abs=1e-6)
    assert report["drop"] == pytest.approx(100 * (report["float"] - report["int8"]), abs=1e-9)
    assert report["agreement"] == pytest.approx(np.mean((p_float >= thresholds) == (p_int8 >= thresholds)), abs=1e-9)
    symbol = json.loads((result.run_dir / "ml-int8-symbol.report.json").read_text())["verification"]
    assert symbol["metric"] == "macro mAP"  # of the symbol's logits through a sigmoid: MXNet's probabilities
    assert symbol["float"] == pytest.approx(_sklearn_macro_map(probs, labels), abs=1e-6)
    rows = predict(out / "ml.int8.onnx", _images(root))
    assert [r["thresholds"] for r in rows] == [dict(zip(sorted(COLOURS), thresholds))] * 4


def test_the_nncf_int8_ir_is_judged_by_macro_map_as_sklearn_computes_it(run, tmp_path):
    """OpenVINO's int8 IR (NNCF) of a multi-label run: its report's macro mAP is scikit-learn's on
    the IR's own probabilities over the val split, and its runtime info keeps the thresholds."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'gluontl[openvino]')")
    pytest.importorskip("nncf", reason="NNCF is not installed (gluontl[openvino-int8])")
    from openvino import Core

    from gluontl.train.runs import evaluate, export_run

    result, _ = run
    out = tmp_path / "ov8"
    written = export_run(result.run_dir, out, export={"formats": ["onnx", "openvino"],
                                                      "quantize": {"calibration": "val", "max_drop": 100}},
                         echo=lambda _: None)
    assert not written.refused
    model = Core().read_model(str(out / "ml.int8-openvino" / "ml.int8.xml"))
    assert "FakeQuantize" in {op.get_type_name() for op in model.get_ops()}
    info = model.get_rt_info()
    report = json.loads(info["gluontl.int8"].astype(str))["verification"]
    probs, x, _ = _val_probs(result.run_dir)
    labels = evaluate(result.run_dir)["labels"]
    net = Core().compile_model(model, "CPU")
    p_int8 = np.asarray(net(x.astype(np.float32))[net.outputs[0]], np.float64)
    assert report["metric"] == "macro mAP" and report["images"] == len(labels)
    assert report["int8"] == pytest.approx(_sklearn_macro_map(p_int8, labels), abs=1e-6)
    assert report["float"] == pytest.approx(_sklearn_macro_map(probs, labels), abs=1e-6)
    assert json.loads(info[META_THRESHOLDS].astype(str)) == pytest.approx(evaluate(result.run_dir)["thresholds"],
                                                                         abs=1e-6)


def test_int8_past_max_drop_is_refused_with_its_macro_map_numbers(run, tmp_path):
    """max_drop 0 and one calibration image: the verdict decides by the macro mAP drop either way
    (int8 kernels differ between CPUs), and a refusal says the numbers and writes no int8 file."""
    from gluontl.train.runs import evaluate, export_run

    result, _ = run
    out = tmp_path / "refused"
    written = export_run(result.run_dir, out, export={"formats": ["onnx"], "quantize": {"calibration": 1,
                                                                                         "max_drop": 0}},
                         echo=lambda _: None)
    probs, _, _ = _val_probs(result.run_dir)
    float_map = _sklearn_macro_map(probs, evaluate(result.run_dir)["labels"])
    assert (out / "ml.onnx").is_file()
    if written.refused:
        (refusal,) = written.refused
        assert (refusal.format, refusal.precision) == ("onnx", "int8") and not (out / "ml.int8.onnx").exists()
        assert f"macro mAP {100 * float_map:.2f} % float" in refusal.reason
        assert "exceeds export.quantize.max_drop 0 points" in refusal.reason
    else:
        report = json.loads((result.run_dir / "ml.int8.json").read_text())["verification"]
        assert report["drop"] <= 0 and report["float"] == pytest.approx(float_map, abs=1e-6)


def test_pos_weight_balanced_is_negatives_over_positives_and_a_wrong_length_is_refused():
    from gluontl.errors import TrainError
    from gluontl.recipe import MultiLabelSpec
    from gluontl.tasks.multilabel import pos_weights

    labels = np.array([[1, 0, 1], [0, 0, 1], [0, 1, 1], [0, 0, 1]])
    np.testing.assert_array_equal(pos_weights(MultiLabelSpec(pos_weight="balanced"), labels), [3.0, 3.0, 1.0])  # a class never negative keeps 1
    assert pos_weights(None, labels) is None and pos_weights(MultiLabelSpec(), labels) is None
    np.testing.assert_array_equal(pos_weights(MultiLabelSpec(pos_weight=[1, 2, 3]), labels), [1, 2, 3])
    with pytest.raises(TrainError, match="multilabel.pos_weight lists 2 numbers"):
        pos_weights(MultiLabelSpec(pos_weight=[1, 2]), labels)


@pytest.mark.parametrize("body, needle", [(b"image,labels\n\xff\xfe.png,red\n", "not UTF-8"),
                                          (b"image,labels\nx.png," + b"r" * 200_000 + b"\n", "field larger")])
def test_a_label_csv_that_is_not_text_or_has_a_giant_field_is_one_data_error(tmp_path, body, needle):
    from gluontl.data.datasets import load_split
    from gluontl.errors import DataError

    (tmp_path / "labels.csv").write_bytes(body)
    with pytest.raises(DataError, match=needle) as e:
        load_split(_spec(f"labels:{tmp_path / 'labels.csv'}"), "train")
    assert "labels.csv" in str(e.value)
