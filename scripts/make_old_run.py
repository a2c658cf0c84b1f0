"""Write ``tests/fixtures/old_run/``: a tiny run folder made by an older gluontl, which
``tests/test_old_run.py`` resumes and exports with today's code (issue 32: old run folders still
resume and export). Run it with the OLD checkout first on the path, e.g. main at 7a6ec71:

    PYTHONPATH=/work/main python scripts/make_old_run.py

It holds ``tests.helpers.tiny_symbol``'s net (``tiny-symbol.json``, ``tiny-0000.params``) and
``old/`` (the run folder): one epoch of ``tiny_recipe`` (digits 5-9, SGD with momentum, an EMA, the csv
callback; the recipe names the net as ``symbol:tiny``, relative to the fixture folder). The
commit that made it is in ``tests/fixtures/old_run/MADE_BY``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
OUT = HERE / "tests" / "fixtures" / "old_run"


def main() -> None:
    import gluontl
    from gluontl.api import finetune
    from tests.helpers import tiny_recipe, tiny_symbol

    src = Path(gluontl.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    tiny_symbol(OUT)
    os.chdir(OUT)
    recipe = tiny_recipe("tiny", name="old", epochs=1, lr=0.05, ema={"decay": 0.99}, callbacks=[{"csv": {}}],
                         export=["onnx"])
    finetune(recipe, runs_root=".", quiet=True, export=False)
    (OUT / "MADE_BY").write_text(f"gluontl {commit}, by scripts/make_old_run.py\n")
    print(f"wrote {OUT} with gluontl at {commit}", file=sys.stderr)


if __name__ == "__main__":
    main()
