"""demo:elpv_graded: the ELPV cells in four classes by defect probability, split as demo:elpv."""
import importlib.util
from pathlib import Path

import pytest

from gluontl.data import demo
from gluontl.data.datasets import load_split
from gluontl.recipe import DataSpec

GRADE = {0.0: "p0", 1 / 3: "p33", 2 / 3: "p67", 1.0: "p100"}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gluontl_home")


def test_each_cell_sits_in_its_grade_and_the_split_is_demo_elpvs(home):
    """labels.csv read here, independently of gluontl; 1508 / 295 / 106 / 715 cells (issue 37)."""
    labels = Path(importlib.util.find_spec("elpv_dataset").origin).parent / "data" / "labels.csv"
    grade = {}
    for line in labels.read_text().splitlines():
        if line.strip():
            path, prob, _ = line.split()
            grade[Path(path).name] = min(GRADE.items(), key=lambda kv: abs(kv[0] - float(prob)))[1]
    graded, binary = demo.elpv_folder(0.2, home, graded=True), demo.elpv_folder(0.2, home)
    got = {p.name: (p.parent.parent.name, p.parent.name) for p in graded.rglob("*.png")}
    assert len(got) == len(grade) == 2624
    assert {name: c for name, (_, c) in got.items()} == grade
    counts = {c: sum(1 for _, g in got.values() if g == c) for c in GRADE.values()}
    assert counts == {"p0": 1508, "p33": 295, "p67": 106, "p100": 715}
    assert {name: s for name, (s, _) in got.items()} == {p.name: p.parent.parent.name for p in binary.rglob("*.png")}


def test_the_demo_source_loads_four_classes(home, monkeypatch):
    monkeypatch.setenv("GLUONTL_HOME", str(home))
    ds = load_split(DataSpec(source="demo:elpv_graded"), "val", check=False)
    assert ds.class_names == ["p0", "p100", "p33", "p67"]  # folder order without data.classes
    ds = load_split(DataSpec(source="demo:elpv_graded", classes=["p0", "p33", "p67", "p100"]), "val", check=False)
    assert [int((ds.labels == i).sum()) for i in range(4)] == [302, 59, 21, 143]
