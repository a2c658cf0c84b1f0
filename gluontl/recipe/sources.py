"""Resolving what a recipe names on disk: a model spec as people type it (bare path, prefix or zoo
name) to its prefixed form, and what an ONNX model file declares about itself (its input size, its
normalization). The schema asks these when it validates; nothing here knows the schema."""
from __future__ import annotations

import difflib
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

from ..errors import GluontlError, ModelSourceError
from ..home import gluontl_home
from ..zoo import zoo_input_shape, zoo_names

SOURCE_FORMS = ("PATH.onnx or onnx:PATH (an ONNX file); PREFIX, PREFIX-symbol.json or symbol:PREFIX (an MXNet "
                "checkpoint PREFIX-symbol.json + PREFIX-NNNN.params); NAME or zoo:NAME (a Gluon/GluonCV model-zoo "
                "name, `gluontl zoo` lists them)")


def resolve_source(text: str) -> str:
    """The prefixed form (``zoo:``, ``symbol:``, ``onnx:``) of a model spec as people type it.

    Bare paths and names are what users try first; resolving them where ``ModelSpec``
    validates ``source`` makes CLI arguments, recipes and the API agree. The model zoo
    (a slow gluoncv import) is consulted only when nothing on disk matches. Paths expand
    ``~`` and ``$VAR``/``${VAR}`` as a shell would, so a recipe can name a file under
    ``$GLUONTL_HOME`` (which means its default when unset, as everywhere in gluontl).
    """
    scheme, _, rest = text.partition(":")
    if scheme in ("zoo", "symbol", "onnx"):
        if not rest.strip():
            raise ModelSourceError(f"Model spec '{text}' names no model after '{scheme}:'. "
                                   f"Accepted forms: {SOURCE_FORMS}.")
        return text if scheme == "zoo" else f"{scheme}:{_expand(rest)}"
    if not text.strip():
        raise ModelSourceError(f"The model spec is empty. Accepted forms: {SOURCE_FORMS}.")
    text = _expand(text)
    if text.lower().endswith(".onnx"):
        return f"onnx:{text}"
    if text.endswith("-symbol.json"):
        return f"symbol:{text.removesuffix('-symbol.json')}"
    if _exists(Path(f"{text}-symbol.json"), "is_file"):
        return f"symbol:{text}"
    if _exists(Path(text), "is_dir"):
        raise ModelSourceError(f"'{text}' is a directory, not a model. Pass a model file or name; accepted "
                               f"forms: {SOURCE_FORMS}.")
    if _exists(Path(text), "is_file"):
        if _parses_as_onnx(text):
            return f"onnx:{text}"
        hint = (" A .params file holds weights only: pass its symbol PREFIX as the model (and the file as "
                "model.weights)." if text.endswith(".params") else "")
        raise ModelSourceError(f"'{text}' is a file but neither an ONNX model nor an MXNet symbol checkpoint."
                               f"{hint} Accepted forms: {SOURCE_FORMS}.")
    if "/" in text or "\\" in text:
        raise ModelSourceError(f"Model file '{text}' does not exist (nor does '{text}-symbol.json'). Check the "
                               f"path; accepted forms: {SOURCE_FORMS}.")
    names = zoo_names()
    if text.lower() in names:
        return f"zoo:{text}"
    close = difflib.get_close_matches(text.lower(), names, n=5)
    raise ModelSourceError(f"'{text}' is not a file, a symbol prefix or a model-zoo name (close zoo names: "
                           f"{', '.join(close) or 'none'}). Accepted forms: {SOURCE_FORMS}.")


def _expand(path: str) -> str:
    path = os.path.expanduser(path)
    if not os.environ.get("GLUONTL_HOME"):
        path = re.sub(r"\$(GLUONTL_HOME\b|\{GLUONTL_HOME\})", lambda _: str(gluontl_home()), path)
    return os.path.expandvars(path)


def _exists(path: Path, test: str) -> bool:
    try:
        return getattr(path, test)()
    except (OSError, ValueError):  # a name too long or with a NUL byte exists nowhere
        return False


def _parses_as_onnx(path: str) -> bool:
    import onnx

    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # protobuf has no single parse-error type; any failure means "not ONNX"
        return False
    return bool(graph.node or graph.output)



def declared_input_shape(data: Any) -> Any:
    """A model section's data with the input size its source is made for where ``input_shape`` is
    left out: a zoo model its family's (InceptionV3: 299), an ONNX file the C, H, W its first input
    declares (when all three are numbers). Anything wrong with the source is left for its own
    validation (or its loader) to say."""
    if isinstance(data, Mapping) and "input_shape" not in data and isinstance(data.get("source"), str):
        try:
            source = resolve_source(data["source"])
            if source.startswith("zoo:"):
                return {**data, "input_shape": zoo_input_shape(source)}
            if source.startswith("onnx:"):
                from ..convert.efficientnet_lite import IMAGE_SIZE, ensure_onnx_file, made_on_first_use
                from ..onnx import inspect_onnx

                # resolved again, as sources.model_inputs resolves what it is given
                path = resolve_source(source)[5:]
                if made_on_first_use(path):
                    return {**data, "input_shape": (3, IMAGE_SIZE, IMAGE_SIZE)}
                inputs = inspect_onnx(ensure_onnx_file(path), check=False).inputs
                declared = inputs[0][1] if inputs else None
                if declared and len(declared) == 4 and all(isinstance(d, int) and d > 0 for d in declared[1:]):
                    return {**data, "input_shape": tuple(declared[1:])}
        except GluontlError:
            return data
    return data


def file_normalize(source: str) -> tuple[Any, str] | Literal[False] | None:
    """The normalization an ONNX model file declares for its input, and where it says so: gluontl's
    own ``gluontl.preprocess`` metadata (its exports, its converted EfficientNet-Lite0). False: an
    ONNX file that declares none; None: not an ONNX file (or one that cannot be read here: the
    model source reports that)."""
    try:
        source = resolve_source(source)
        if not source.startswith("onnx:"):
            return None
        from ..convert.efficientnet_lite import ensure_onnx_file, made_on_first_use, preprocess_record

        if made_on_first_use(source[5:]):
            return _normalize_of(preprocess_record())
        path = Path(ensure_onnx_file(source[5:]))
        stat = path.stat()
    except (GluontlError, OSError):
        return None
    return _declared_normalize(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _declared_normalize(path: str, mtime: int, size: int) -> tuple[Any, str] | Literal[False] | None:
    import onnx

    try:
        props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    except Exception:  # protobuf has no single parse-error type; the model source reports it
        return None
    try:
        record = json.loads(props["gluontl.preprocess"])
    except (KeyError, TypeError, ValueError):
        return False
    return _normalize_of(record)


def _normalize_of(record: Any) -> tuple[Any, str] | Literal[False]:
    """The (mean, std) of a ``gluontl.preprocess`` record; False when it declares none usable."""
    try:
        mean, std = (tuple(float(v) for v in record[k]) for k in ("mean", "std"))
        if record.get("scale") != 255.0 or len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            return False
    except (AttributeError, KeyError, TypeError, ValueError):
        return False
    return (mean, std), "model file metadata gluontl.preprocess"

