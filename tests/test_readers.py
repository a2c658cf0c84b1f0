"""The reading policy (gluontl/readers.py, issue 36): safe YAML without aliases, tags or deep
nesting; bounded JSON; JSON lines that skip and count a broken row; the image door's pixel cap
whatever Pillow's global says; file names that are not UTF-8 named and hashed, never a crash; a
run that fails before its first checkpoint leaves no folder; and a ratchet on unsafe readers in
gluontl/ (an allow-list that may only shrink)."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tests import helpers
import mxnet as mx
import numpy as np
import pytest
import yaml
from PIL import Image

from tests.fuzzing import bomb_png
from gluontl.errors import DataError, TrainError

MAX_YAML_DEPTH = 64  # gluontl.readers.MAX_YAML_DEPTH, checked below (imports inside the tests, so the
# findings' tests run against main too)

PACKAGE = Path(__file__).resolve().parents[1] / "gluontl"


# ---------------------------------------------------------------- YAML

@pytest.mark.parametrize("text, says", [
    ("a: &a [1, 2]\nb: *a\n", "aliases (*a) are not allowed, line 2"),
    ("a: !!python/object/apply:os.system ['true']\n", "tags (tag:yaml.org,2002:python/object/apply:os.system)"),
    ("a: !!binary aGk=\n", "tags (tag:yaml.org,2002:binary)"),
    ("a: !custom 1\n", "tags (!custom)"),
    ("a: " + "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1) + "\n", f"deeper than {MAX_YAML_DEPTH}"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "deeper than"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_yaml_refusals_name_the_file(tmp_path, text, says):
    from gluontl.readers import MAX_YAML_DEPTH as depth, read_yaml

    assert depth == MAX_YAML_DEPTH
    p = tmp_path / "card.yaml"
    p.write_text(text)
    with pytest.raises(DataError) as e:
        read_yaml(p, DataError, "the card")
    assert f"Cannot read the card '{p}'" in str(e.value) and says in str(e.value)


def test_yaml_plain_data_reads_as_pyyaml_safe_load(tmp_path):
    from gluontl.readers import read_yaml

    text = "names:\n  0: cat\n  1: dog\nn: 3\nx: [1.5, 'a', null]\ns: !!str 5\n"
    p = tmp_path / "ok.yaml"
    p.write_text(text.replace("s: !!str 5\n", ""))
    assert read_yaml(p, DataError) == yaml.safe_load(text.replace("s: !!str 5\n", ""))


def test_oversized_and_non_utf8_files_are_refused(tmp_path):
    from gluontl.readers import read_json, read_text, read_yaml

    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b"#" * (1 << 20))
    with pytest.raises(DataError, match="bytes, over the"):
        read_yaml(big, DataError)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(TrainError, match="not UTF-8"):
        read_json(bad, TrainError)
    with pytest.raises(TrainError, match="not valid JSON"):
        (tmp_path / "deep.json").write_text("[" * 100000)
        read_json(tmp_path / "deep.json", TrainError)
    with pytest.raises(DataError, match="does not exist|No such file"):
        read_text(tmp_path / "missing.txt", DataError)


def test_json_lines_skip_and_count_broken_rows(tmp_path):
    from gluontl.readers import read_json_lines

    p = tmp_path / "m.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 2, \n[3]\n\xff\xfe{"step": 3}\n\n{"step": 4}\n{"step": 5')
    assert read_json_lines(p, TrainError) == ([{"step": 1}, {"step": 4}], 4)


# ---------------------------------------------------------------- images

def test_the_pixel_cap_holds_when_pillow_s_limit_is_lifted(tmp_path, monkeypatch):
    """A library may set Image.MAX_IMAGE_PIXELS = None (some do at import); gluontl's cap stays."""
    from gluontl.data.transforms import MAX_IMAGE_PIXELS, image_problem, load_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    p = tmp_path / "wide.png"
    p.write_bytes(bomb_png(MAX_IMAGE_PIXELS // 1000 + 1, 1000))
    with pytest.raises(DataError, match="pixels, over the") as e:
        load_image(p)
    assert str(p) in str(e.value)
    assert "over the" in image_problem(p)


def test_a_bomb_in_a_class_folder_is_a_bad_image_naming_it(tmp_path):
    from gluontl.data.datasets import load_split
    from gluontl.recipe import DataSpec

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(4):
            Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / c / f"ok{i}.png")
    (tmp_path / "b" / "bomb.png").write_bytes(bomb_png())
    with pytest.raises(DataError) as e:
        load_split(DataSpec(source=f"folder:{tmp_path}", val_fraction=0.5), "train")
    assert "bomb.png" in str(e.value) and "pixels" in str(e.value)


# ---------------------------------------------------------------- names that are not UTF-8

def _byte_folder(root: Path, classes: str = "56789", per_class: int = 6) -> None:
    """Class folders whose images have byte names that are not UTF-8 (copied from old archives)."""
    rs = np.random.RandomState(0)
    for split in ("train", "val"):
        for c in classes:
            folder = root / split / c
            folder.mkdir(parents=True)
            for i in range(per_class):
                name = os.fsdecode(b"img\xff\xe9" + str(i).encode() + b".png")
                Image.fromarray(rs.randint(0, 255, (16, 16, 3)).astype(np.uint8)).save(folder / name)


def test_shown_writes_undecodable_bytes_as_escapes():
    from gluontl.readers import shown

    assert shown(os.fsdecode(b"/data/img\xff.png")) == "/data/img\\xff.png"
    assert shown("/data/ümlaut.png") == "/data/ümlaut.png"


def test_the_feature_cache_key_hashes_non_utf8_names_as_their_bytes(tmp_path):
    """On main the key's ``.encode()`` crashed on them (UnicodeEncodeError, exit 1)."""
    from gluontl.data.cache import cache_key
    from gluontl.data.datasets import load_split
    from gluontl.data.prefix import Split
    from gluontl.recipe import DataSpec, parse_recipe

    _byte_folder(tmp_path / "data", classes="ab", per_class=2)
    spec = DataSpec(source=f"folder:{tmp_path / 'data'}")
    train, val = load_split(spec, "train"), load_split(spec, "val")
    net = mx.gluon.nn.Dense(2, in_units=3, prefix="d_")
    net.initialize(mx.init.Constant(0.5))
    recipe = parse_recipe({"name": "t", "model": {"source": "zoo:resnet18_v1"}, "data": spec.model_dump()},
                          origin="test")
    key = cache_key(recipe, Split(net, net, "d_fwd", "test"), (2,), train, val)
    items = hashlib.sha256()
    for ds in (train, val):
        names = [os.fsencode(ds.name(i)) for i in range(len(ds))]
        assert any(b"\xff\xe9" in n for n in names)
        items.update(b"\n".join(names) + b"\0" + ds.labels.tobytes() + b"\0")
    assert key["items_sha256"] == items.hexdigest()


def test_finetune_on_non_utf8_names_trains_and_a_failed_run_leaves_no_folder(tmp_path, capsys):
    """Through the CLI: on main the first run ended in an internal error (exit 1) from the feature
    cache's key and each attempt left a run folder (rec, rec-2, ...)."""
    _byte_folder(tmp_path / "data")
    recipe = {"name": "rec", "model": {"source": helpers.tiny_symbol(tmp_path), "input_shape": [3, 16, 16]},
              "data": {"source": f"folder:{tmp_path / 'data'}", "batch_size": 4, "train_transform": {"resize": 16},
                       "val_transform": {"resize": 16}},
              "rules": [{"match": "*conv0*", "grad_req": "null"}],
              "train": {"epochs": 1, "cache_features": "on", "guards": "off"}, "export": {"formats": []}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    runs = tmp_path / "runs"
    code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs", str(runs), "-q")
    assert code == 0, err
    assert sorted(p.name for p in runs.iterdir()) == ["rec"]
    for _ in range(2):  # diverges in its first steps: a failure after the folder was made
        code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs", str(runs),
                                         "-q", "--set", "train.lr=1e30", "--set", "train.max_bad_steps=2")
        assert code == 2 and "no checkpoint was written yet" in " ".join(err.split()), err
    assert sorted(p.name for p in runs.iterdir()) == ["rec"]


# ---------------------------------------------------------------- the ratchet

# Reads of user files that the policy forbids; each entry is a file and how many such lines it may
# still have. It may only shrink: a new one fails, and so does an entry with fewer than listed.
UNSAFE = {
    "yaml": re.compile(r"\byaml\.(load|safe_load|full_load|unsafe_load|load_all|safe_load_all)\("),
    "pickle": re.compile(r"\bpickle\.(load|loads|Unpickler)\b|allow_pickle\s*=\s*True|\bmarshal\.loads?\("),
    "json": re.compile(r"\bjson\.load\(|\bjson\.loads\(.*\.read_(text|bytes)\("),
}
ALLOWED = {
    ("yaml", "readers.py"): 1,  # the one safe loader
    ("pickle", "convert/torch_legacy.py"): 1,  # the restricted unpickler: a fixed list of names, nothing runs
    ("json", "detect/runs.py"): 1,  # predictions.json the same call just wrote
    ("json", "export/bench.py"): 1,  # NAME-preprocess.json beside an export (errors caught and named)
    ("json", "adapters.py"): 1,  # an adapter's NAME.json (errors caught and named)
}


def test_no_unsafe_reader_beyond_the_allow_list():
    found: dict[tuple[str, str], int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            for kind, rx in UNSAFE.items():
                if rx.search(code):
                    found[(kind, rel)] = found.get((kind, rel), 0) + 1
    assert found == ALLOWED, (f"unsafe readers changed: new {sorted(set(found.items()) - set(ALLOWED.items()))}, "
                              f"gone (shrink ALLOWED) {sorted(set(ALLOWED.items()) - set(found.items()))}")


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_folder(tmp_path, capsys):
    """On main each failed attempt left a half-made run folder: rec, rec-2, rec-3."""
    recipe = {"name": "rec", "model": {"source": helpers.tiny_symbol(tmp_path), "input_shape": [3, 16, 16]},
              "data": helpers.DIGITS_5_9, "train": {"epochs": 1, "lr": 1e30, "max_bad_steps": 2, "guards": "off"},
              "export": {"formats": []}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    for _ in range(3):
        code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs",
                                         str(tmp_path / "runs"), "-q")
        assert code == 2 and "NaN/Inf" in err, err
    assert list((tmp_path / "runs").iterdir()) == []
