"""How ONNX import, a first forward and export scale with the number of graph outputs (issue 36).

Generates graphs x -> N outputs (each Relu/Sigmoid/Neg/Abs of x, so every fourth node computes
the same as an earlier one, which is what made MXNet's common-subexpression pass cubic) and
prints, per size, the CPU seconds of import + first forward, and of ``export_block`` (symbol
and ONNX, verified in onnxruntime), with the ratio of each to the smallest size scaled
linearly (1.0 = linear). Sizes over the output limit (4,096) are refused: the time of the
refusal is printed. CPU time (this process and its threads), so a loaded machine does not
inflate it; ``--with-cse`` turns MXNet's pass back on to measure what it cost.

    python scripts/bench_onnx_outputs.py [--sizes 250,500,1000,2000,4000,10000] [--with-cse]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def graph(n: int, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    ops = ["Relu", "Sigmoid", "Neg", "Abs"]
    g = helper.make_graph([helper.make_node(ops[i % 4], ["x"], [f"y{i}"], name=f"n{i}") for i in range(n)], "many",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["N", 4]) for i in range(n)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="250,500,1000,2000,4000,10000")
    ap.add_argument("--with-cse", action="store_true", help="keep MXNet's common-subexpression pass (main's behaviour)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import mxnet as mx

    import gluontl.mxinternals.graphblock as graphblock
    from gluontl.errors import GluontlError
    from gluontl.export.exporters import export_block
    from gluontl.onnx import import_model, inspect_onnx

    if args.with_cse:
        graphblock.CSE_MAX_DUPLICATES = sys.maxsize
    sizes = [int(s) for s in args.sizes.split(",")]
    base = None
    print(f"{'outputs':>8} {'inspect s':>10} {'import+fwd s':>13} {'export s':>9} {'vs linear':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"m{n}.onnx"
            graph(n, path)
            t0 = time.process_time()
            report = inspect_onnx(path)
            t_inspect = time.process_time() - t0
            t0 = time.process_time()
            try:
                block = import_model(str(path))
                block(mx.nd.ones((1, 4)))
                mx.nd.waitall()
            except GluontlError as e:
                print(f"{n:>8} {t_inspect:>10.2f} refused in {time.process_time() - t0:.2f} s: {str(e)[:90]}")
                continue
            t_import = time.process_time() - t0
            t0 = time.process_time()
            export_block(block, Path(tmp) / f"out{n}", f"m{n}", {"x": (1, 4)}, formats=["symbol", "onnx"])
            t_export = time.process_time() - t0
            total = t_import + t_export
            base = base or (n, total)
            ratio = (total / base[1]) / (n / base[0])
            print(f"{n:>8} {t_inspect:>10.2f} {t_import:>13.2f} {t_export:>9.2f} {ratio:>9.2f}x"
                  + ("  (inspect lists problems)" if report.problems else ""), flush=True)


if __name__ == "__main__":
    main()
