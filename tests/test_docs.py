"""The documentation's recipes are recipes, and its links lead somewhere.

Every ```yaml block in README.md and docs/*.md is validated with ``parse_recipe`` (the schema only:
it opens no file, so ``folder:photos`` or a ``weights:`` path need not exist). A block with top-level
``name:`` and ``model:`` is a whole recipe; any other block is a fragment of one (a ``train:``
section, a ``rules:`` list) and is validated inside a minimal recipe (``name`` and a zoo ``model``
added), so a misspelt key in a fragment fails too. A YAML block that is not part of a recipe at all
(a detection data file, say) is marked by the line ``<!-- not-a-recipe -->`` right before its
opening fence, and skipped.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gluontl.recipe import parse_recipe
from gluontl.recipe.overrides import RecipeLoader

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = "<!-- not-a-recipe -->"
BLOCK = re.compile(r"(?:^(?P<mark>[^\n]*)\n)?^```yaml\n(?P<body>.*?)^```", re.M | re.S)


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of each ```yaml block not marked as outside any recipe."""
    return [(text[:m.start("body")].count("\n"), m["body"]) for m in BLOCK.finditer(text)
            if (m["mark"] or "").strip() != SKIP]


def as_recipe_data(body: str) -> dict:
    # a recipe file's YAML (1.2 booleans: `cache_features: off` is the string a recipe means)
    data = yaml.load(body, Loader=RecipeLoader)
    assert isinstance(data, dict), "a recipe block must be a YAML mapping (or be marked not-a-recipe)"
    if "name" in data and "model" in data:
        return data
    return {"name": "fragment", "model": {"source": "zoo:resnet18_v1"}, **data}


CASES = [pytest.param(page, line, body, id=f"{page.relative_to(ROOT)}:{line}")
         for page in PAGES for line, body in yaml_blocks(page.read_text(encoding="utf-8"))]


def test_the_docs_have_recipes() -> None:
    pages = {page.name for page, *_ in (c.values for c in CASES)}
    assert {"README.md", "recipes.md"} <= pages


@pytest.mark.parametrize("page, line, body", CASES)
def test_yaml_block_is_a_valid_recipe(page: Path, line: int, body: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    parse_recipe(as_recipe_data(body), origin=f"{page.name}:{line}")


def test_a_misspelt_key_in_a_snippet_fails(tmp_path, monkeypatch) -> None:
    """What the check above would catch: a typo'd key in a whole recipe and in a fragment."""
    from gluontl.errors import RecipeError
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    text = ("```yaml\nname: a\nmodel: {source: resnet18_v1}\ntrain: {epoch: 3}\n```\n\n"
            "```yaml\ntrain:\n  distributed: {backend: kvstore, kv_store: dist_sync}\n```\n\n"
            f"{SKIP}\n```yaml\nclasses: [cat, dog]\n```\n")
    blocks = yaml_blocks(text)
    assert [line for line, _ in blocks] == [1, 7]  # the marked block is skipped
    for _, body in blocks:
        with pytest.raises(RecipeError, match=r"epoch|kv_store"):
            parse_recipe(as_recipe_data(body))


LINK = re.compile(r"\]\((?!https?://|mailto:)([^)#\s]+)?(?:#([\w-]+))?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading slugs (code blocks' ``# comments`` are not headings)."""
    found, fence = set(), False
    for ln in page.read_text(encoding="utf-8").splitlines():
        fence ^= ln.startswith("```")
        heading = re.match(r"#{1,6} (.*)", ln)
        if heading and not fence:
            found.add(re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
        dest = (page.parent / target).resolve() if target else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [p.name for p in PAGES[1:] if f"](docs/{p.name})" not in readme] == []


PYTHON = re.compile(r"^```python\n(?P<body>.*?)^```", re.M | re.S)
MY_RECIPE = """name: docs
model: {{source: "symbol:{prefix}", input_shape: [3, 16, 16]}}
data: {{source: demo:digits, classes: ["5", "6", "7", "8", "9"], batch_size: 16,
       train_transform: {{resize: 16}}, val_transform: {{resize: 16}}}}
train: {{epochs: 3, lr: 0.1, log_every: 5}}
export: {{formats: []}}
"""


def test_the_callbacks_page_python_runs(tmp_path, monkeypatch) -> None:
    """docs/callbacks.md's custom callback and custom metric, each under 30 lines, run on a small
    digits recipe: the callback saw every step, the metric picked the best checkpoint."""
    from tests import helpers
    import gluontl
    from gluontl.metrics import unregister_metric

    blocks = [m["body"] for m in PYTHON.finditer((ROOT / "docs" / "callbacks.md").read_text(encoding="utf-8"))]
    assert len(blocks) == 2 and all(len(b.strip().splitlines()) < 30 for b in blocks)
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_recipe.yaml").write_text(MY_RECIPE.format(prefix=helpers.tiny_symbol(tmp_path, deep=False)))
    callback: dict = {}
    exec(compile(blocks[0], "docs/callbacks.md:callback", "exec"), callback)
    steps = [r["step"] for r in callback["result"].metrics if "epoch" in r][-1]
    assert len(callback["watch"].losses) == steps > 0
    metric: dict = {}
    try:
        exec(compile(blocks[1], "docs/callbacks.md:metric", "exec"), metric)
    finally:
        unregister_metric("val_f1")
    rows = [r for r in metric["result"].metrics if "epoch" in r]
    assert metric["result"].best["select"] == "val_f1"
    assert metric["result"].best["epoch"] == max(rows, key=lambda r: (r["val_f1"], -r["epoch"]))["epoch"]


def test_a_docs_block_is_read_as_a_recipe_file_is() -> None:
    """`cache_features: off` in a docs block is the string a recipe file means (YAML 1.2), not
    YAML 1.1's False, which the schema refuses."""
    parse_recipe(as_recipe_data("train:\n  cache_features: off\n"))
