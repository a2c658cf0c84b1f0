"""Time onnxruntime on gluontl's lean ONNX export against PyTorch's ONNX export of the same nets.

Two steps, in two venvs (MXNet needs numpy 1.x, torch wants numpy 2; never mix them):

    # 1. write gluontl's lean exports of resnet18_v1 and mobilenetv2_1.0 into DIR
    /tmp/venv/bin/python scripts/bench_vs_torch_export.py --make-gluontl /tmp/onnx_vs_torch

    # 2. export the plain-torch twins (torchvision-equivalent definitions, no torchvision
    #    needed) into the same DIR and time each pair in one onnxruntime process
    /tmp/torchvenv/bin/python scripts/bench_vs_torch_export.py --compare /tmp/onnx_vs_torch \
        --json /tmp/onnx_vs_torch/rows.json

Random weights (latency only), 224x224, batches 1 and 32. onnxruntime: CPU EP,
``intra_op_num_threads`` = ``--threads`` (default 2), ORT_ENABLE_ALL; ``--warmup`` runs per
file, then ``--repeats`` timed runs with the two files of a pair interleaved run by run so
they share machine noise; the table reports medians and ratio = gluontl / torch. Op-type
counts of both graphs go to the JSON rows to help explain a ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

MODELS = ["resnet18_v1", "mobilenetv2_1.0"]
SIZE = 224


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--make-gluontl", type=Path, metavar="DIR", help="write gluontl's lean exports (MXNet venv)")
    mode.add_argument("--compare", type=Path, metavar="DIR", help="export torch models and time both (torch venv)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    return ap.parse_args()


# --------------------------------------------------------------------------- gluontl side


def make_gluontl(out_dir: Path) -> None:
    import gluontl  # noqa: F401  (numpy's removed aliases, before gluoncv imports mxnet)
    from gluoncv import model_zoo

    from gluontl.export import export_onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        net = model_zoo.get_model(name)
        net.initialize()
        path = export_onnx(net, out_dir / f"gluontl_{name}.onnx", {"data": (1, 3, SIZE, SIZE)}, force=True)
        print(f"wrote {path}")


# --------------------------------------------------------------------------- torch side


def _torch_models():
    """Plain-torch ResNet-18 and MobileNetV2 (1.0), layer for layer as in torchvision."""
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], 64
            for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    def conv_bn_act(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            self.use_res = stride == 1 and cin == cout
            layers = [] if t == 1 else [conv_bn_act(cin, hidden, 1, 1)]
            layers += [
                conv_bn_act(hidden, hidden, 3, stride, groups=hidden),
                nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
                nn.BatchNorm2d(cout),
            ]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            setting = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
            feats, cin = [conv_bn_act(3, 32, 3, 2)], 32
            for t, c, n, s in setting:
                for i in range(n):
                    feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            feats.append(conv_bn_act(cin, 1280, 1, 1))
            self.features = nn.Sequential(*feats)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(x.flatten(1))

    return {"resnet18_v1": ResNet18, "mobilenetv2_1.0": MobileNetV2}


def export_torch(out_dir: Path) -> dict[str, Path]:
    import torch

    torch.manual_seed(0)
    paths = {}
    for name, cls in _torch_models().items():
        model = cls().eval()
        path = out_dir / f"torch_{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(
                model,
                (torch.randn(1, 3, SIZE, SIZE),),
                str(path),
                dynamo=False,
                opset_version=13,
                input_names=["input"],
                output_names=["output"],
                dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
            )
        print(f"wrote {path}")
        paths[name] = path
    return paths


# --------------------------------------------------------------------------- timing


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    return dict(sorted(Counter(n.op_type for n in onnx.load(str(path)).graph.node).items()))


def compare(args: argparse.Namespace) -> None:
    import numpy as np
    import onnxruntime as ort

    out_dir: Path = args.compare
    torch_paths = export_torch(out_dir)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    rng = np.random.default_rng(0)
    rows = []
    for name in MODELS:
        files = {"gluontl": out_dir / f"gluontl_{name}.onnx", "torch": torch_paths[name]}
        if not files["gluontl"].exists():
            raise SystemExit(f"{files['gluontl']} missing: run --make-gluontl {out_dir} with /tmp/venv/bin/python first")
        sessions = {k: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for k, p in files.items()}
        counts = {k: _op_counts(p) for k, p in files.items()}
        for batch in args.batches:
            x = rng.standard_normal((batch, 3, SIZE, SIZE), dtype=np.float32)
            runs = {k: (lambda s=s: s.run(None, {s.get_inputs()[0].name: x})) for k, s in sessions.items()}
            for run in runs.values():
                for _ in range(args.warmup):
                    run()
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.repeats):
                for k, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[k].append(1000 * (time.perf_counter() - start))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({
                "model": name,
                "batch": batch,
                "gluontl_ms": round(med["gluontl"], 3),
                "torch_ms": round(med["torch"], 3),
                "ratio": round(med["gluontl"] / med["torch"], 3),
                "gluontl_min_ms": round(min(times["gluontl"]), 3),
                "torch_min_ms": round(min(times["torch"]), 3),
                "repeats": args.repeats,
                "threads": args.threads,
                "ops": counts,
            })
            print(f"{name} b{batch}: gluontl {med['gluontl']:.2f} ms, torch {med['torch']:.2f} ms", flush=True)

    print(f"\nonnxruntime {ort.__version__}, CPU EP, {args.threads} threads, median of {args.repeats} interleaved runs")
    print(f"{'model':<16} {'batch':>5} {'gluontl ms':>11} {'torch ms':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:<16} {r['batch']:>5} {r['gluontl_ms']:>11.2f} {r['torch_ms']:>9.2f} {r['ratio']:>6.3f}")
    for name in MODELS:
        c = next(r["ops"] for r in rows if r["model"] == name)
        print(f"\n{name} node counts  gluontl: {sum(c['gluontl'].values())} {c['gluontl']}")
        print(f"{name} node counts  torch:   {sum(c['torch'].values())} {c['torch']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"\nwrote {args.json}")


def main() -> None:
    args = _parse()
    if args.make_gluontl:
        make_gluontl(args.make_gluontl)
    else:
        compare(args)


if __name__ == "__main__":
    main()
