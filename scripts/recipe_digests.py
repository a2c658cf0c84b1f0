"""Print the digests of the stored old recipes (tests/recipe/old/*.yaml) as the gluontl on
PYTHONPATH computes them: the whole recipe's, the resume check's and the feature cache's.

tests/recipe/old/digests.json holds main's (7a6ec71), made from the branch root with
``PYTHONPATH=/path/to/main-checkout python scripts/recipe_digests.py``; tests/recipe/test_compat.py
asserts this code computes the same."""
import json
from pathlib import Path

from gluontl.recipe import load_recipe
from gluontl.train.loop import _resume_digest

out = {}
for f in sorted(Path("tests/recipe/old").glob("*.yaml")):
    r = load_recipe(f)
    out[f.name] = {"digest": r.digest(), "resume": _resume_digest(r), "data cache": r.digest("model", "surgery", "data")}
print(json.dumps(out, indent=1))
