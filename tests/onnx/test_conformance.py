"""The onnx package's own backend test data, imported through ``import_model``.

Eligible: cases whose ops all have a converter (or fold evaluator) at the case's opset
and whose graph inputs and outputs are all float32. Every eligible case either matches
its stored outputs, or is a real limitation the importer refuses with a clear error
(``REFUSED``: the test asserts the error), or has stored outputs onnxruntime does not
reproduce (``ORT_REFERENCE``: compared with onnxruntime's float kernels instead, and a
test checks the disagreement is still there). Nothing is xfailed: a wrong number fails.
Cases refused for a run-time Resize scale run again with it stored in the model
(``STORED``), and a few cases with other numeric types pin the converters of exported
models (``TYPED_MATCH``, ``TYPED_REFUSED``).
``scripts/onnx_support.py`` runs the same cases to write docs/onnx-support.md.
"""
from __future__ import annotations

import functools
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model
from gluontl.onnx.registry import carrier_dtype, get, get_evaluator
from tests.helpers import ort_session

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
STRUCTURAL = frozenset({"Constant", "Identity"})  # present in many cases, not what they test

# onnx 1.20's data adds cases and corrects one stored output (the version setup.cfg pins on Python 3.13)
ONNX_1_20 = tuple(int(v) for v in onnx.__version__.split(".")[:2]) >= (1, 20)

# MXNet fixes every shape when the graph is built: a value that sets an output shape
# (Resize scales, Range bounds) cannot be a run-time graph input. Case -> the error's text.
_RUNTIME_INPUT = "must be known at import time but it is a graph input"
REFUSED: dict[str, str] = {
    "node/test_constant": "has no graph inputs",
    "node/test_range_float_type_positive_delta": f"Range node .*'start'.*{_RUNTIME_INPUT}",
    **{f"node/test_{case}": f"(Resize|Upsample) node .*'scales'.*{_RUNTIME_INPUT}" for case in (
        "resize_downsample_scales_cubic", "resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "resize_downsample_scales_cubic_align_corners", "resize_downsample_scales_cubic_antialias",
        "resize_downsample_scales_linear", "resize_downsample_scales_linear_align_corners",
        "resize_downsample_scales_linear_antialias", "resize_downsample_scales_linear_half_pixel_symmetric",
        "resize_downsample_scales_nearest", "resize_upsample_scales_cubic",
        "resize_upsample_scales_cubic_A_n0p5_exclude_outside", "resize_upsample_scales_cubic_align_corners",
        "resize_upsample_scales_cubic_asymmetric", "resize_upsample_scales_linear",
        "resize_upsample_scales_linear_align_corners", "resize_upsample_scales_linear_half_pixel_symmetric",
        "resize_upsample_scales_nearest", "resize_upsample_scales_nearest_axes_2_3",
        "resize_upsample_scales_nearest_axes_3_2", "upsample_nearest")},
    # RotaryEmbedding's function body (onnx 1.20) splits the head into its rotated part and the
    # rest, here empty (the whole head rotates): MXNet holds no empty tensor
    **({f"node/test_rotary_embedding_no_position_ids{v}_expanded":
         r"Split node .*split sizes \[8, 0\] make an empty output" for v in ("", "_interleaved")}
       if ONNX_1_20 else {}),
}
# Refused for a run-time input that real models store: run again with every graph input
# but the first stored as an initializer (a Resize's roi and scales), so the converter's
# numbers are still checked.
STORED = frozenset(c for c, why in REFUSED.items() if why.startswith("(Resize|Upsample)"))
_ALIGN_CORNERS_DOWN = (
    "the stored output (onnx.reference) takes align_corners' output length as the fractional "
    "input length x scale; onnxruntime (and PyTorch) use the integer output size")
# Stored outputs (written by onnx's reference implementation) that onnxruntime, the
# project's oracle, does not reproduce. Case -> why.
ORT_REFERENCE: dict[str, str] = {
    # onnx 1.20 corrected it: its stored output, onnxruntime's and a count by hand (taps inside
    # the input and its explicit pads, in float64) agree within 1.1e-7; 1.17's is off by 0.064
    **({} if ONNX_1_20 else {
        "node/test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True":
            "the stored output divides ceil-mode windows that run past the input by the full kernel "
            "size; onnxruntime (and PyTorch) count only input and explicit-pad positions"}),
    "node/test_resize_downsample_scales_linear_align_corners": _ALIGN_CORNERS_DOWN,
    "node/test_resize_downsample_scales_cubic_align_corners": _ALIGN_CORNERS_DOWN,
}


# Cases with other numeric types (outside the float32 count) that pin converters users meet
# in exported models, run with every input but the first stored (``_stored``): they match...
TYPED_MATCH = frozenset(f"node/test_{c}" for c in (
    "shape", "shape_clip_end", "shape_clip_start", "shape_end_1", "shape_end_negative_1",
    "shape_example", "shape_start_1", "shape_start_1_end_2", "shape_start_1_end_negative_1",
    "shape_start_negative_1", "size", "size_example", "slice_end_out_of_bounds",
    *(f"reduce_{r}_empty_set" for r in ("l1", "l2", "log_sum", "log_sum_exp", "max", "min",
                                         "prod", "sum", "sum_square")),
    "reduce_log_sum_empty_set_expanded", "maxpool_with_argmax_2d_precomputed_pads",
    "maxpool_with_argmax_2d_precomputed_strides",
    *(f"pow_types_{t}" for t in ("float32_int32", "float32_int64", "float32_uint32",
                                 "float32_uint64", "int32_float32", "int32_int32",
                                 "int64_float32", "int64_int64")),
)) | {"pytorch-converted/test_Embedding", "pytorch-converted/test_Embedding_sparse"}
# ...or are refused at import, naming the node (MXNet holds no empty tensor). Case -> the
# error's text.
_EMPTY_INPUT = "node .*'{}' has shape .*: it is empty"
TYPED_REFUSED: dict[str, str] = {
    **{f"node/test_reduce_{r}_empty_set_expanded": _EMPTY_INPUT.format("data")
       for r in ("l1", "l2", "log_sum_exp", "sum_square")},
    "node/test_reduce_sum_empty_set_non_reduced_axis_zero": "ReduceSum node .*keeps a zero-size axis",
    "node/test_reshape_allowzero_reordered": "Reshape " + _EMPTY_INPUT.format("data"),
    "node/test_slice_start_out_of_bounds": "Slice node .*axis 1 is empty",
    "node/test_split_zero_size_splits_opset13": "Split " + _EMPTY_INPUT.format("input"),
    "node/test_split_zero_size_splits_opset18": "Split " + _EMPTY_INPUT.format("input"),
}


def _is_float32(v: onnx.ValueInfoProto) -> bool:
    return v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


_T = onnx.TensorProto
_NUMERIC = {_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BOOL, _T.INT8, _T.UINT8, _T.INT16, _T.UINT16,
            _T.INT32, _T.UINT32, _T.INT64, _T.UINT64}


def _is_numeric(v: onnx.ValueInfoProto) -> bool:
    return v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _NUMERIC


def case_ops(model: onnx.ModelProto) -> list[tuple[str, str, int]]:
    """(domain, op, opset) of every node; the ops a case exercises."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    return sorted({(n.domain, n.op_type, opsets.get(n.domain, opsets.get("", 1)))
                   for n in model.graph.node})


def is_registered(domain: str, op: str, opset: int) -> bool:
    return get(op, opset, domain) is not None or get_evaluator(op, domain) is not None


@functools.lru_cache(maxsize=None)
def all_cases() -> tuple[tuple[str, Path, tuple, bool, bool], ...]:
    """(id, folder, ops, eligible, typed) for every stored case with a test data set;
    ``typed``: all ops registered but some input/output is another numeric type (only
    reported by scripts/onnx_support.py)."""
    out = []
    for suite in SUITES:
        for d in sorted((DATA / suite).iterdir()):
            if not (d / "model.onnx").is_file() or not (d / "test_data_set_0").is_dir():
                continue
            model = onnx.load(str(d / "model.onnx"), load_external_data=False)
            inits = {t.name for t in model.graph.initializer}
            ops = tuple(case_ops(model))
            values = [v for v in model.graph.input if v.name not in inits] + list(model.graph.output)
            registered = all(is_registered(*o) for o in ops)
            eligible = registered and all(_is_float32(v) for v in values)
            typed = registered and not eligible and all(_is_numeric(v) for v in values)
            out.append((f"{suite}/{d.name}", d, ops, eligible, typed))
    return tuple(out)


def _read(path: Path) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def case_id(folder: Path) -> str:
    return f"{folder.parent.name}/{folder.name}"


def _ort_outputs(folder: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(folder / "model.onnx")
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), inputs)})


def _stored(folder: Path, inputs: list[np.ndarray]) -> onnx.ModelProto:
    """The case's model with every graph input but the first an initializer holding the
    data set's value."""
    model = onnx.load(str(folder / "model.onnx"))
    held = {t.name for t in model.graph.initializer}
    runtime = [v for v in model.graph.input if v.name not in held]
    model.graph.initializer.extend(numpy_helper.from_array(x, v.name)
                                   for v, x in zip(runtime[1:], inputs[1:]))
    del model.graph.input[:]
    model.graph.input.append(runtime[0])
    return model


def _data_sets(folder: Path):
    for ds in sorted(folder.glob("test_data_set_*")):
        inputs = [_read(p) for p in sorted(ds.glob("input_*.pb"), key=lambda p: int(p.stem[6:]))]
        expected = [_read(p) for p in sorted(ds.glob("output_*.pb"), key=lambda p: int(p.stem[7:]))]
        yield inputs, expected


def run_case(folder: Path, stored: bool = False) -> None:
    """Import, run every data set, compare with the stored outputs (rtol 1e-3, as onnx does)
    or, for ``ORT_REFERENCE`` cases, with onnxruntime's. ``stored``: the inputs after the
    first are stored in the model (``_stored``)."""
    block = None if stored else import_model(str(folder / "model.onnx"))
    for inputs, expected in _data_sets(folder):
        if case_id(folder) in ORT_REFERENCE:
            expected = _ort_outputs(folder, inputs)
        if stored:
            block, inputs = import_model(_stored(folder, inputs)), inputs[:1]
        # rank-0 inputs go in as shape () NDArrays, as users have them (the block carries
        # them as shape (1,)); rank-0 outputs come out as shape (1,)
        out = block(*[mx.nd.array(x, dtype=carrier_dtype(x.dtype)) for x in inputs])
        got = [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
        assert len(got) == len(expected), (len(got), len(expected))
        for g, e in zip(got, expected):
            g = g.reshape(()) if e.ndim == 0 and g.shape == (1,) else g
            assert g.shape == e.shape, f"shape {g.shape} != expected {e.shape}"
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=1e-3, atol=1e-5)


def _params():
    for cid, folder, _, eligible, _ in all_cases():
        if eligible:
            yield pytest.param(folder, id=cid)


@pytest.mark.parametrize("folder", list(_params()))
def test_conformance(folder):
    refused = REFUSED.get(case_id(folder))
    if refused is None:
        run_case(folder)
        return
    with pytest.raises(OnnxImportError, match=refused):
        import_model(str(folder / "model.onnx"))


@pytest.mark.parametrize("cid", sorted(STORED))
def test_refused_for_a_runtime_input_converts_once_it_is_stored(cid):
    run_case(DATA / cid, stored=True)


@pytest.mark.parametrize("cid", sorted(TYPED_MATCH))
def test_typed_case_matches_once_its_shape_inputs_are_stored(cid):
    run_case(DATA / cid, stored=True)


@pytest.mark.parametrize("cid", sorted(TYPED_REFUSED))
def test_typed_case_is_refused_by_name(cid):
    inputs, _ = next(_data_sets(DATA / cid))
    with pytest.raises(OnnxImportError, match=TYPED_REFUSED[cid]):
        import_model(_stored(DATA / cid, inputs))


def test_listed_cases_are_eligible():
    """A stale entry (case renamed, op unregistered) must be removed from the lists."""
    eligible = {cid for cid, _, _, ok, _ in all_cases() if ok}
    listed = set(REFUSED) | set(ORT_REFERENCE)
    assert not listed - eligible, sorted(listed - eligible)
    typed = {cid for cid, _, _, _, other in all_cases() if other}
    assert not (TYPED_MATCH | set(TYPED_REFUSED)) - typed


@pytest.mark.parametrize("cid", sorted(ORT_REFERENCE))
def test_onnxruntime_still_disagrees_with_the_stored_outputs(cid):
    """Once the onnx package's data agrees with onnxruntime, the entry goes."""
    folder = DATA / cid
    for inputs, expected in _data_sets(folder):
        ref = _ort_outputs(folder, inputs)
        assert any(not np.allclose(r, e, rtol=1e-3, atol=1e-5) for r, e in zip(ref, expected))
