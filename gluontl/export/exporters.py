"""Export a Gluon block to MXNet symbol/params or lean ONNX, verified before it is written."""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import onnx
from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
from onnx import helper, shape_inference, version_converter

from gluontl.adapters import merge_adapters
from gluontl.atomic import atomic_write
from gluontl.errors import ExportError
from gluontl.mxinternals import graph_of, symbol_from
from gluontl.mxinternals.graphblock import common_expr_pass
from gluontl.export import mx_ops  # noqa: F401  (registers converters mx.onnx lacks)
from gluontl.export.artifacts import Exported
from gluontl.export.lean import make_lean
from gluontl.export.patch import patch_model, source_info
from gluontl.export.trace import TracedBlock, dummy_inputs, predict, sample_batches, trace_block
from gluontl.export.errorbound import output_budgets
from gluontl.export.verify import FIXED_RTOL, compare, ort_session, output_error, saturating_scales
from gluontl.data.transforms import META_CLASSES, META_PREPROCESS, META_TASK, load_preprocess, onnx_props

log = logging.getLogger(__name__)

# mx.onnx 1.9.1 has translation tables for opsets 12 and 13 only; newer opsets go through
# onnx's version converter and are then verified like any other export.
_MX_ONNX_MAX_OPSET = 13
_PROTOBUF_LIMIT = 2**31 - 1


def check_target(path: Path, force: bool) -> None:
    """Fail before any work if ``path`` exists (without ``force``) or its folder is unusable.

    Writability is probed by creating a file: permission bits do not stop root, and
    read-only or virtual filesystems only show up when a write is attempted.
    """
    if path.exists() and not force:
        raise ExportError(f"{path} already exists; refusing to overwrite it. Pass force=True (--force) to replace it.")
    if path.is_dir():
        raise ExportError(f"{path} is a directory; give a file name to export to.")
    if not path.parent.is_dir():
        raise ExportError(
            f"Cannot write {path}: its folder {path.parent} does not exist or is not a directory. "
            "Create the folder or choose another output path."
        )
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as err:
        raise _cannot_create(path, err) from err


def _cannot_create(path: Path, err: OSError) -> ExportError:
    return ExportError(
        f"Cannot write {path}: creating a file in {path.parent} failed ({err.strerror}). "
        "Choose a writable output folder."
    )


def _scratch_dir(path: Path) -> Path:
    """A private folder beside ``path`` (same filesystem, so free space is checked for real)."""
    try:
        return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    except OSError as err:
        raise _cannot_create(path, err) from err


def _normalize_dense(traced: TracedBlock) -> TracedBlock:
    """Spell out FullyConnected's ``flatten`` so mx.onnx reads it right, and make it
    ``True`` where the input is 2-D (it then changes nothing).

    mx.onnx reads a missing ``flatten`` as False although MXNet's default is True, which
    mis-converts >2-D inputs. And it turns ``flatten=False`` into Gemm plus eight
    Shape/Slice/Concat/Reshape nodes that ONNX shape inference cannot prove a no-op,
    while MXNet knows the input rank (it does not depend on the batch size).
    """
    nodes = graph_of(traced.symbol)
    internals = traced.symbol.get_internals()
    known = {k: v.shape for k, v in {**traced.arg_params, **traced.aux_params}.items()}
    _, shapes, _ = internals.infer_shape(**traced.input_shapes, **known)
    shape_of = dict(zip(internals.list_outputs(), shapes))

    def entry_shape(nid: int, index: int) -> tuple[int, ...] | None:
        node = nodes["nodes"][nid]
        if node["op"] == "null":
            return shape_of.get(node["name"])
        single = f"{node['name']}_output"
        return shape_of[single] if index == 0 and single in shape_of else shape_of.get(f"{single}{index}")

    changed = False
    for node in nodes["nodes"]:
        if node["op"] != "FullyConnected":
            continue
        attrs = node.setdefault("attrs", {})
        flatten = attrs.get("flatten", "True").lower() in ("true", "1")
        shape = entry_shape(*node["inputs"][0][:2])
        flatten = flatten or (shape is not None and len(shape) == 2)
        if attrs.get("flatten") != str(flatten):
            attrs["flatten"] = str(flatten)
            changed = True
    if not changed:
        return traced
    return dataclasses.replace(traced, symbol=symbol_from(nodes))


def _prefix_free_names(traced: TracedBlock) -> TracedBlock:
    """Rename layers whose name begins another node's name by appending ``~``.

    mx.onnx names the helper tensors of layer ``X`` ``X_0``, ``X_1``, ``X_shape``...; graphs
    imported from ONNX (PyTorch numbering: ``/attn/MatMul``, ``/attn/MatMul_1``) then get two
    tensors of one name, and the second layer reads the first one's int64 helper. Output
    identities keep their names (they are the file's output names and make no helpers).
    """
    nodes = graph_of(traced.symbol)
    movable = [n for n in nodes["nodes"] if n["op"] != "null" and n["name"] not in traced.output_names]

    def starts_another(name: str, pool: list[str]) -> bool:  # the names starting with it follow it
        i = bisect.bisect_right(pool, name)
        return i < len(pool) and pool[i].startswith(name)

    changed = False
    while True:
        pool = sorted(n["name"] for n in nodes["nodes"])
        clashing = [n for n in movable if starts_another(n["name"], pool)]
        if not clashing:
            break
        for node in clashing:
            node["name"] += "~"
        changed = True
    if not changed:
        return traced
    return dataclasses.replace(traced, symbol=symbol_from(nodes))


@contextlib.contextmanager
def _graph_check_at_model_opset() -> Iterator[None]:
    """mx.onnx checks the bare graph against the newest opset the onnx package knows, not the
    one it writes (so a ReduceMean with an ``axes`` attribute, valid at opset 13, fails: the
    attribute became an input in opset 18). ``_finish`` checks the whole model at its own
    opset instead, so the graph-only check is skipped while mx.onnx runs."""
    original = onnx.checker.check_graph
    onnx.checker.check_graph = lambda *args, **kwargs: None
    try:
        yield
    finally:
        onnx.checker.check_graph = original


def _mx_to_onnx(traced: TracedBlock, opset: int) -> onnx.ModelProto:
    """``mx.onnx``'s conversion of the traced graph; inputs reordered to the block's argument
    order and the batch dimension left free, nothing else changed."""
    names = list(traced.input_shapes)
    graph_order = [n for n in traced.symbol.list_inputs() if n in traced.input_shapes]
    shapes = [traced.input_shapes[n] for n in graph_order]
    mx_opset = min(opset, _MX_ONNX_MAX_OPSET)
    try:
        with _graph_check_at_model_opset():
            graph = MXNetGraph().create_onnx_graph_proto(
                traced.symbol, {**traced.arg_params, **traced.aux_params}, shapes,
                [onnx.TensorProto.FLOAT] * len(shapes), opset_version=mx_opset,
                dynamic=True, dynamic_input_shapes=[(None, *s[1:]) for s in shapes])
    except (AttributeError, NotImplementedError, ValueError, AssertionError, KeyError, mx.base.MXNetError) as err:
        raise ExportError(
            f"mx.onnx cannot convert this model to ONNX opset {opset}: {str(err).rstrip('.')}. Replace the unsupported "
            "layer, or ship the model with export_symbol instead."
        ) from err
    opsets = [helper.make_opsetid("", mx_opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gluontl",
                              ir_version=helper.find_min_ir_version_for(opsets))
    # Inputs in the block's argument order, so positional callers and the file agree.
    by_name = {v.name: v for v in model.graph.input}
    reordered = [by_name[n] for n in names] + [v for v in model.graph.input if v.name not in traced.input_shapes]
    del model.graph.input[:]
    model.graph.input.extend(reordered)
    _set_batch_dims(model.graph, traced)
    return model


def _set_batch_dims(graph: onnx.GraphProto, traced: TracedBlock) -> None:
    """Dim 0 of inputs is "batch"; an output dim is "batch" where MXNet says it follows the batch."""
    for value in graph.input:
        if value.name in traced.input_shapes:
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
    one, two = traced.batched_output_shapes(1), traced.batched_output_shapes(2)
    by_name = {v.name: v for v in graph.output}
    ordered = [by_name[n] for n in traced.output_names]
    del graph.output[:]
    graph.output.extend(ordered)
    for value, s1, s2 in zip(graph.output, one, two):
        dims = value.type.tensor_type.shape.dim
        for dim, a, b in zip(dims, s1, s2):
            dim.Clear()
            if a == b:
                dim.dim_value = a
            elif (a, b) == (1, 2):
                dim.dim_param = "batch"


def finish_model(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The export at ``opset``, checked, with every node named: mx.onnx leaves some nodes nameless, and
    a node only ``export.quantize.exclude`` can match by name (its first output's, unique in a graph)."""
    for node in model.graph.node:
        if not node.name and node.output:
            node.name = node.output[0]
    if opset > _MX_ONNX_MAX_OPSET:
        try:
            model = version_converter.convert_version(model, opset)
        except Exception as err:  # the converter raises bare RuntimeErrors from C++
            raise ExportError(f"onnx cannot convert the export to opset {opset}: {err}. Use opset 13.") from err
        model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    del model.graph.value_info[:]
    try:
        model = shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise ExportError(f"The exported ONNX graph is invalid ({err}); please report this model.") from err
    return model


def _verification_batches(input_shapes: dict[str, tuple[int, ...]], dtypes: dict[str, np.dtype],
                          sizes: list[int], sample: dict[str, np.ndarray] | None
                          ) -> list[tuple[str, dict[str, np.ndarray]]]:
    batches = [(f"random batch of {b}", dummy_inputs(input_shapes, b, seed=b, dtypes=dtypes)) for b in sizes]
    if sample is None:
        return batches
    if set(sample) != set(input_shapes):
        raise ExportError(f"sample has inputs {sorted(sample)} but the model takes {list(input_shapes)}; key it by input name.")
    for name, arr in sample.items():
        if np.shape(arr)[1:] != input_shapes[name][1:]:
            raise ExportError(f"sample[{name!r}] has shape {np.shape(arr)}; expected (N, {', '.join(map(str, input_shapes[name][1:]))}).")
    rows = min(len(a) for a in sample.values())
    if rows == 0:
        raise ExportError("sample has no rows; pass at least one example per input, or sample=None.")
    for b in sorted({1, min(2, rows)} & set(sizes) or {sizes[0]}):
        batches.append((f"sample batch of {b}", {k: np.asarray(v[:b]).astype(dtypes.get(k, np.float32))
                                                 for k, v in sample.items()}))
    return batches


def _from_source(block: mx.gluon.HybridBlock, info, input_shapes: dict[str, tuple[int, ...]] | None,
                 output_names: list[str] | None, opset: int | None, sample: Mapping[str, np.ndarray] | None = None
                 ) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]], dict[str, np.dtype], list[int]]:
    """The imported graph patched (see ``patch``), the batch-1 shapes and dtypes to verify it
    with (free lengths, e.g. a text encoder's, as ``sample`` has them), and the batch sizes it
    accepts (1 and 2 when its batch dimension is free)."""
    names = list(input_shapes) if input_shapes else None
    patched = patch_model(block, info, names if names != list(info.inputs) else None, output_names)
    model = patched.model
    shapes, sizes = {}, [1, 2]
    for k, (name, declared) in enumerate(patched.input_shapes.items()):
        if input_shapes:
            want = tuple(int(d) for d in input_shapes[name])
        else:
            imported = info.input_shapes.get(info.inputs[k]) or declared
            free = info.free_axes.get(info.inputs[k], {})  # a free length: the sample's, else an example
            given = np.shape(sample[name]) if sample is not None and name in sample else ()
            imported = tuple((given[i] if i < len(given) else free[i][1]) if d is None and i in free else d
                             for i, d in enumerate(imported))
            want = tuple(1 if d is None and i == 0 else d for i, d in enumerate(imported))
        if None in want or len(want) != len(declared) or any(
                d is not None and w != d for i, (w, d) in enumerate(zip(want, declared)) if i > 0):
            raise ExportError(
                f"Input '{name}' of the ONNX graph has shape {list(declared)} (None = free); give a concrete "
                f"batch-1 shape that fits it in input_shapes, e.g. {{'{name}': "
                f"{tuple(1 if d is None else d for d in declared)}}} with the free sizes filled in.")
        shapes[name] = want
        if declared and declared[0] is not None:
            sizes = [declared[0]]
            shapes[name] = (declared[0], *want[1:])
    if opset is not None and opset != _opset_of(model):
        try:
            model = version_converter.convert_version(model, opset)
        except Exception as err:  # the converter raises bare RuntimeErrors from C++
            raise ExportError(f"onnx cannot convert the graph from opset {_opset_of(model)} to {opset}: {err}. "
                              "Leave opset unset to keep the model's own.") from err
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"The patched ONNX graph is invalid ({err}); please report this model.") from err
    return model, shapes, patched.input_dtypes, sizes


def set_metadata(model: onnx.ModelProto, metadata: dict[str, str]) -> None:
    """Set ``metadata`` in metadata_props, replacing keys of the same name. Class names and
    preprocessing (and the task) inherited from an imported file are dropped: after training and surgery they
    no longer describe the model unless this export states them again (other keys, such as a
    converted file's provenance, stay)."""
    kept = {p.key: p.value for p in model.metadata_props if p.key not in (META_CLASSES, META_PREPROCESS, META_TASK)}
    del model.metadata_props[:]
    for key, value in {**kept, **metadata}.items():
        model.metadata_props.add(key=str(key), value=str(value))


def _card_props(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], classes: Sequence[str] | None,
                preprocess: Any) -> dict[str, str]:
    """The class-name and preprocessing metadata of a classifier taking one N,3,H,W image batch;
    checked against the graph so ``predict`` cannot meet a file whose metadata does not fit it."""
    if classes is None or preprocess is None:
        raise ExportError(f"export_onnx got {'classes' if preprocess is None else 'preprocess'} without "
                          f"{'preprocess' if preprocess is None else 'classes'}; predict needs both: pass the class "
                          f"names and the transform (e.g. preprocess={{'resize': 224}}), or neither.")
    if isinstance(classes, str) or not (classes and all(isinstance(c, str) for c in classes)):
        raise ExportError(f"classes is {classes!r}; pass the class names in label order, e.g. ['cat', 'dog'].")
    classes = list(classes)
    name, shape = next(iter(shapes.items()))
    if len(shapes) != 1 or len(shape) != 4 or shape[1] != 3:
        raise ExportError(f"classes and preprocess describe an image classifier with one N,3,H,W input; this model "
                          f"takes {shapes}. Export it without them.")
    prep, _ = load_preprocess(preprocess)
    made = prep(np.zeros((shape[2] + 7, shape[3] + 13, 3), np.uint8)).shape
    if made != tuple(shape[1:]):
        raise ExportError(f"preprocess makes inputs of shape {list(made)} from an image of another size, but the "
                          f"model takes {name} of shape {list(shape[1:])}; end the transform with a crop of that "
                          f"size (e.g. {{'resize': {shape[2] if shape[2] == shape[3] else [shape[2], shape[3]]}}}).")
    out = model.graph.output[0].type.tensor_type.shape.dim
    width = out[-1].dim_value if len(out) == 2 and out[-1].HasField("dim_value") else None
    if len(model.graph.output) != 1 or width != len(classes):
        raise ExportError(f"classes lists {len(classes)} names, but the model's outputs are "
                          f"{[(o.name, _dims(o)) for o in model.graph.output]}; a classifier has one N x classes "
                          f"output. Pass one name per output column.")
    return onnx_props({"preprocess": prep.to_json(name, (None, *shape[1:])), "classes": classes})


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def _opset_of(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def convert_block(block: mx.gluon.HybridBlock, input_shapes: dict[str, tuple[int, ...]], *, opset: int = 13,
                  lean: bool = True, output_names: list[str] | None = None) -> tuple[onnx.ModelProto, TracedBlock]:
    """``mx.onnx``'s conversion of ``block`` (lean unless ``lean`` is False), checked at ``opset`` but not
    yet verified against the block; with the trace it came from."""
    if opset < 12:
        raise ExportError(f"opset {opset} is too old for mx.onnx; export with opset 12 or newer (13 recommended).")
    traced = trace_block(block, input_shapes, output_names)
    model = _mx_to_onnx(_prefix_free_names(_normalize_dense(traced)), opset)
    if lean:
        counts = make_lean(model)
        log.info("lean ONNX: folded %(folded_batchnorm)d BatchNorm, dropped %(dropped_noops)d no-op nodes", counts)
    return finish_model(model, opset), traced


def export_onnx(
    block: mx.gluon.HybridBlock,
    path: str | os.PathLike,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    opset: int | None = None,
    force: bool = False,
    lean: bool = True,
    verify: bool = True,
    rtol: float | None = None,
    sample: dict[str, np.ndarray] | None = None,
    output_names: list[str] | None = None,
    metadata: dict[str, str] | None = None,
    classes: Sequence[str] | None = None,
    preprocess: Any = None,
) -> Path:
    """Write ``block`` as ONNX; with ``verify``, only if onnxruntime reproduces the block's
    predict-mode outputs on batches of 1 and 2 (and ``sample``) within the float32 bound of the
    file's graph (``errorbound``: two correct float32 runs differ by at most that), or within
    ``rtol`` of each output's range when ``rtol`` is given (see ``verify.check_output``).

    A block imported from ONNX (also after surgery) is written as its own graph, patched with
    the trained values (see ``patch``): same opset (unless ``opset`` asks for another), node
    and tensor names. Other blocks go through ``mx.onnx`` (opset 13 by default) and, with
    ``lean``, the lean rewrite. ``input_shapes`` maps input names, in the block's argument
    order, to batch-1 shapes; the names become the ONNX input names (imported graphs default to
    their own names and shapes). Outputs are named ``output_names`` (default: the graph's own,
    else ``output`` or ``output0``, ``output1``, ...). ``metadata`` goes into the file's
    metadata_props. ``classes`` (names in label order) with ``preprocess`` (a recipe transform
    as ``TransformSpec`` or dict, or a ``gluontl.preprocess`` record) write the metadata a run's
    export carries, so ``gluontl predict`` and ``gluontl.preprocess`` take the file.
    """
    path = Path(path)
    check_target(path, force)
    plain = merge_adapters(block)  # adapters folded into the weights; verified against ``block`` itself
    info = source_info(plain)
    if info is not None:
        model, shapes, dtypes, sizes = _from_source(plain, info, input_shapes, output_names, opset, sample)
    else:
        if not input_shapes:
            raise ExportError("input_shapes is empty: pass one batch-1 shape per block input, e.g. "
                              "{'data': (1, 3, 224, 224)}.")
        model, traced = convert_block(plain, input_shapes, opset=13 if opset is None else opset, lean=lean,
                                      output_names=output_names)
        shapes, dtypes, sizes = traced.input_shapes, {}, [1, 2]
    if classes is not None or preprocess is not None:
        metadata = {**(metadata or {}), **_card_props(model, shapes, classes, preprocess)}
    set_metadata(model, metadata or {})
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise ExportError(f"The model is larger than 2 GB, the ONNX protobuf limit, so {path} cannot hold it; use export_symbol.")
    data = model.SerializeToString()
    if verify:
        session = ort_session(data, f"the export for {path} (not written)")
        scales, budgets = saturating_scales(model), output_budgets(model)
        for label, batch in _verification_batches(shapes, dtypes, sizes, sample):
            report = compare(session, block, batch, rtol, scales, budgets)
            if not report.ok:
                worst = report.worst
                raise ExportError(
                    f"Export to {path} was not written: onnxruntime disagrees with the MXNet block on a "
                    f"{label}: output {worst.name!r} differs by up to {worst.max_abs:.2e} "
                    f"({worst.rel:.2e} of the output's range) > tolerance {worst.tolerance:.2e} "
                    f"({worst.why}); {report.describe()}. "
                    + ("The graph was patched from the imported file, so an importer converter computes "
                       "something onnxruntime does not; please report the model."
                       if info is not None else
                       "The model likely uses an op mx.onnx converts wrongly; re-run with lean=False to see "
                       "whether the lean rewrite is at fault, or set rtol (relative to the output's range) "
                       "if the difference is acceptable.")
                )
            log.info("verified %s on %s: max error %.2e of the output range", path, label, report.max_rel)
    return atomic_write(path, lambda p: p.write_bytes(data), ExportError)


def export_symbol(
    block: mx.gluon.HybridBlock,
    prefix: str | os.PathLike,
    input_shapes: dict[str, tuple[int, ...]],
    *,
    epoch: int = 0,
    force: bool = False,
) -> tuple[Path, Path]:
    """Write ``PREFIX-symbol.json`` and ``PREFIX-%04d.params``, the files
    ``mx.gluon.SymbolBlock.imports(json, list(input_shapes), params)`` reloads.

    The pair is written to a scratch folder, reloaded and compared with the block before
    either is copied into place, so a written pair is known to reproduce the block.
    """
    prefix = os.fspath(prefix)
    json_path, params_path = Path(f"{prefix}-symbol.json"), Path(f"{prefix}-{epoch:04d}.params")
    for target in (json_path, params_path):
        check_target(target, force)
    traced = trace_block(merge_adapters(block), input_shapes)
    params = {f"arg:{k}": v for k, v in traced.arg_params.items()}
    params.update({f"aux:{k}": v for k, v in traced.aux_params.items()})
    scratch = _scratch_dir(json_path)
    try:
        tmp_json, tmp_params = scratch / json_path.name, scratch / params_path.name
        try:
            traced.symbol.save(os.fspath(tmp_json), remove_amp_cast=True)
            mx.nd.save(os.fspath(tmp_params), params)
        except (OSError, mx.base.MXNetError) as err:
            raise ExportError(f"Cannot write {json_path.parent}: {err}. Check free space and permissions.") from err
        with warnings.catch_warnings():  # imports() warns that input dtypes are unknown; they are float32
            warnings.simplefilter("ignore", UserWarning)
            reloaded = mx.gluon.SymbolBlock.imports(os.fspath(tmp_json), list(traced.input_shapes), os.fspath(tmp_params))
        batch = dummy_inputs(traced.input_shapes, 2, seed=2)
        with common_expr_pass(traced.symbol):
            got_all = predict(reloaded, batch)
        for name, got, want in zip(traced.output_names, got_all, predict(block, batch)):
            max_abs, rel = output_error(got, want)
            if rel > 1e-5:  # the same MXNet ops run again: only kernel-choice noise is allowed
                raise ExportError(
                    f"{json_path} was not written: reloading it gives output {name!r} differing from the block "
                    f"by up to {max_abs:.2e} ({rel:.1e} of its range). Please report this model."
                )
        atomic_write(json_path, lambda p: shutil.copyfile(tmp_json, p), ExportError)
        try:
            atomic_write(params_path, lambda p: shutil.copyfile(tmp_params, p), ExportError)
        except ExportError:
            json_path.unlink(missing_ok=True)
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return json_path, params_path


class BlockGraph:
    """A plain network's ONNX graph: ``export_onnx`` of the block (no task finisher), verified
    against it on ``sample`` and random batches."""

    note = ""
    compare = None

    def __init__(self, block, name: str, input_shapes: Mapping[str, tuple[int, ...]], *, opset: int | None = None,
                 rtol: float | None = None, lean: bool = True, sample: Mapping[str, np.ndarray] | None = None,
                 output_names: list[str] | None = None, card: Mapping[str, Any] | None = None) -> None:
        self.block, self.name, self.shapes = block, name, dict(input_shapes)
        self.opset, self.rtol, self.lean, self.output_names = opset, rtol, lean, output_names
        self.sample = None if sample is None else dict(sample)
        self.metadata = onnx_props(card) if card else None

    def write_onnx(self, folder: Path, overwrite: bool) -> Path:
        return export_onnx(self.block, Path(folder) / f"{self.name}.onnx", self.shapes, opset=self.opset,
                           rtol=self.rtol, lean=self.lean, force=overwrite,
                           sample=None if self.sample is None else dict(self.sample),
                           output_names=self.output_names, metadata=self.metadata)

    def batches(self) -> list[tuple[str, np.ndarray]]:
        first = next(iter(self.sample.values())) if self.sample else None
        return sample_batches(None if first is None else np.asarray(first, np.float32), next(iter(self.shapes.values())))


def export_block(block, out_dir: str | Path, name: str, input_shapes: Mapping[str, tuple[int, ...]], *,
                 formats: Sequence[str], opset: int | None = None, rtol: float | None = None, lean: bool = True,
                 force: bool = False, sample: Mapping[str, np.ndarray] | None = None,
                 output_names: list[str] | None = None, card: Mapping[str, Any] | None = None,
                 judge: Any = None, int8: Any = None, echo: Any = log.info, graph: Any = None) -> Exported:
    """Export ``block`` in each of ``formats`` (names in ``export.registry``), each verified before
    it is written.

    ``input_shapes`` maps each input name, in call order, to its batch-first shape. ``card``
    (a run's preprocessing and class names) goes into the ONNX metadata_props and beside the
    symbol files as ``NAME-preprocess.json``; bare models have none. ``graph`` is the task's
    ONNX graph (a ``registry.GraphFinisher``: a detector's NMS, a segmenter's arg-max; default the
    block's own, verified on ``sample`` too); formats made from ONNX (OpenVINO) convert that
    verified file. A ``judge`` (a run's validation split and metric) checks such formats by the
    task's metric, and ``int8`` (a QuantizeSpec) adds the int8 partners made there.
    """
    from gluontl.export import registry

    registry.check_formats(formats, "formats")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"Output folder '{out}' is a file; pass a folder (new or existing) with --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"Cannot create the output folder '{out}': {e.strerror}. Pick a writable place "
                          f"with --out.") from None
    if graph is None:
        graph = BlockGraph(block, name, input_shapes, opset=opset, rtol=rtol, lean=lean, sample=sample,
                           output_names=output_names, card=card)
    job = registry.ExportJob(block, out, name, dict(input_shapes), graph, rtol=rtol, force=force, card=card,
                             judge=judge, int8=int8, echo=echo)
    return registry.write(job, formats, Exported())
