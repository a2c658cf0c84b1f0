"""Write tests/onnx/fixtures/timm/: small timm models exported by both PyTorch exporters, each
with timm's own stage (``group_matcher(coarse=True)`` group) of every ONNX initializer.

gluontl derives stage maps from the graph alone; timm's hand-written group matchers are an
independent reference for the same question ("which stage is this parameter in?"), so
tests/onnx/test_stages_timm.py compares the two parameter by parameter without torch.

    python3.11 -m venv /work/venvs/torch
    /work/venvs/torch/bin/pip install torch==2.13.0            # the CPU build, from this machine's disk
    echo torch==2.13.0+cpu > c.txt; /work/venvs/torch/bin/pip install -c c.txt timm onnx onnxscript onnxruntime
    /work/venvs/torch/bin/pip uninstall -y torchvision         # see _torchvision_stub
    /work/venvs/torch/bin/python scripts/make_timm_stage_fixtures.py [NAME ...]

Models are timm's own classes at small widths/depths (random weights, seeded) that keep each
architecture's structure kinds (SE, windows, attention, dense concat, re-param branches).
For each file ``NAME_{legacy,dynamo}.json`` beside it maps every float initializer to the timm
parameter or module it came from and that module's timm group:

- an initializer that is a torch parameter/buffer by name (the dynamo exporter keeps them);
- else one equal by value to a torch tensor (or its transpose: the legacy exporter's MatMul
  weights), when exactly one torch tensor matches;
- else (a convolution with its BatchNorm folded in) the module named by its consuming node: the
  legacy exporter's node name (``/stages/stages.0/blocks/blocks.0/conv_dw/Conv``) or the dynamo
  exporter's ``pkg.torch.onnx.name_scopes``.

Dynamo files keep only ``pkg.torch.onnx.name_scopes`` of the exporter's node metadata (stack
traces are most of a small file's bytes).
"""
from __future__ import annotations

import hashlib
import json
import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "onnx" / "fixtures" / "timm"


def _torchvision_stub():
    """timm imports torchvision; PyPI's torchvision wheel is built against CUDA torch, so with the
    CPU torch 2.13.0 its C extension cannot load and its op registrations fail on import. timm
    needs only torchvision's Python parts here: declare the two ops it registers fakes for."""
    for op in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass


_torchvision_stub()
import timm  # noqa: E402
from timm.models._manipulate import group_parameters  # noqa: E402


# ------------------------------------------------------------------ the models

def resnet():
    from timm.models.resnet import BasicBlock, ResNet
    return ResNet(BasicBlock, layers=(1, 1, 2, 1), channels=(8, 16, 32, 64), stem_width=8, num_classes=10)


def efficientnet():
    from timm.models.efficientnet import _gen_efficientnet
    return _gen_efficientnet("efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.34, num_classes=10)


def mobilenetv3():
    from timm.models.mobilenetv3 import _gen_mobilenet_v3
    m = _gen_mobilenet_v3("mobilenetv3_large_100", channel_multiplier=0.35, depth_multiplier=0.5, num_classes=10)
    # the conv head (after the global pool, timm's head group) at 64 rather than 1280 channels
    m.conv_head = nn.Conv2d(m.conv_head.in_channels, 64, 1)
    m.classifier = nn.Linear(64, 10)
    return m


def regnet():
    from timm.models.regnet import RegNet, RegNetCfg
    return RegNet(RegNetCfg(depth=6, w0=8, wa=8.0, wm=2.0, group_size=8, se_ratio=0.25), num_classes=10)


def convnext():
    from timm.models.convnext import ConvNeXt
    return ConvNeXt(depths=(1, 1, 2, 1), dims=(16, 24, 32, 48), num_classes=10)


def vit():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, mlp_ratio=2,
                             num_classes=10)


def deit():
    from timm.models.deit import VisionTransformerDistilled
    return VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2,
                                      num_classes=10)


def swin():
    from timm.models.swin_transformer import SwinTransformer
    return SwinTransformer(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1, 2, 1),
                           num_heads=(1, 2, 2, 4), mlp_ratio=2, num_classes=10)


def mobilevit():
    from timm.models.byobnet import ByobNet, ByoModelCfg
    from timm.models.mobilevit import _inverted_residual_block, _mobilevit_block
    cfg = ByoModelCfg(
        blocks=(_inverted_residual_block(d=1, c=8, s=1, br=2.0),
                _inverted_residual_block(d=2, c=12, s=2, br=2.0),
                _mobilevit_block(d=1, c=16, s=2, transformer_dim=16, transformer_depth=1, patch_size=2, br=2.0),
                _mobilevit_block(d=1, c=24, s=2, transformer_dim=24, transformer_depth=2, patch_size=2, br=2.0),
                _mobilevit_block(d=1, c=32, s=2, transformer_dim=32, transformer_depth=1, patch_size=2, br=2.0)),
        stem_chs=8, stem_type="3x3", stem_pool="", downsample="", act_layer="silu", num_features=64)
    return ByobNet(cfg, num_classes=10)


def efficientformer():
    from timm.models.efficientformer import EfficientFormer
    return EfficientFormer(depths=(1, 1, 2, 2), embed_dims=(16, 24, 32, 48), num_vit=1, num_classes=10)


def repvgg():
    from timm.models.byobnet import ByobNet, ByoModelCfg, _rep_vgg_bcfg
    cfg = ByoModelCfg(blocks=_rep_vgg_bcfg(d=(1, 2, 2, 1), wf=(0.25, 0.25, 0.25, 0.5)), stem_type="rep", stem_chs=16)
    return ByobNet(cfg, num_classes=10)


def densenet():
    from timm.models.densenet import DenseNet
    return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), bn_size=2, num_classes=10)


MODELS = {  # name: (constructor, C,H,W)
    "resnet": (resnet, (3, 64, 64)), "efficientnet": (efficientnet, (3, 64, 64)),
    "mobilenetv3": (mobilenetv3, (3, 64, 64)), "regnet": (regnet, (3, 64, 64)),
    "convnext": (convnext, (3, 64, 64)), "vit": (vit, (3, 32, 32)), "deit": (deit, (3, 32, 32)),
    "swin": (swin, (3, 64, 64)), "mobilevit": (mobilevit, (3, 64, 64)),
    "efficientformer": (efficientformer, (3, 224, 224)), "repvgg": (repvgg, (3, 64, 64)),
    "densenet": (densenet, (3, 64, 64)),
}
OPSET = {"legacy": 17, "dynamo": 18}
KEEP_META = "pkg.torch.onnx.name_scopes"


def build(name):
    """Seeded timm init, non-trivial norm affines and BatchNorm running statistics."""
    ctor, shape = MODELS[name]
    torch.manual_seed(0)
    model = ctor()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.1)
            elif p.numel() > 1 and bool((p == p.flatten()[0]).all()):  # layer scales at 1e-6: distinct
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))      # values, so none is deduplicated
        model.train()
        for _ in range(3):
            model(torch.randn(4, *shape) * 2 + 0.3)
    return model.eval()


def export(model, shape, path, exporter):
    x = torch.randn(2, *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=OPSET[exporter],
                                     dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}},
                                     input_names=["x"], output_names=["y"])
            prog.save(str(path))
        else:
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=OPSET[exporter],
                              input_names=["x"], output_names=["y"], do_constant_folding=True,
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def check(model, path, shape) -> float:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for b in (1, 2):
        x = np.random.RandomState(b).randn(b, *shape).astype(np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        if not err <= 1e-4:
            raise RuntimeError(f"{path.name}: onnxruntime vs torch relative error {err:.2e} at batch {b}")
        worst = max(worst, err)
    return worst


def _legacy_module(node_name: str, modules: set[str]) -> str | None:
    """``/stages/stages.0/blocks/blocks.0/conv_dw/Conv`` → ``stages.0.blocks.0.conv_dw``: each scope
    segment is a module's name relative to the previous one, except a Sequential's child, which
    repeats its container's segment (``blocks`` then ``blocks.0``)."""
    parts: list[str] = []
    for seg in node_name.strip("/").split("/")[:-1]:
        if parts and seg.startswith(parts[-1] + "."):
            parts[-1] = seg
        else:
            parts.append(seg)
    path = ".".join(parts)
    return path if path in modules else None


def _dynamo_module(node: onnx.NodeProto, modules: set[str]) -> str | None:
    for p in node.metadata_props:
        if p.key == KEEP_META:
            scopes = [s for s in json.loads(p.value.replace("'", '"')) if s in modules and s]
            return scopes[-1] if scopes else None
    return None


def reference(model, proto: onnx.ModelProto, exporter: str) -> dict:
    """Every float initializer: the timm parameter/module it came from and its timm group."""
    groups = group_parameters(model, model.group_matcher(coarse=True))
    group_of = {n: int(g) for g, names in groups.items() for n in names}
    modules = {n for n, _ in model.named_modules()}
    tensors = {n: t.detach().numpy() for n, t in model.state_dict().items() if t.dtype.is_floating_point}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)

    def module_group(mod: str) -> int | None:
        gs = {g for n, g in group_of.items() if n.startswith(mod + ".")}
        return gs.pop() if len(gs) == 1 else None

    out = {}
    for init in proto.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype.kind != "f" or arr.size <= 1:
            continue
        entry = {"shape": list(arr.shape), "size": int(arr.size)}
        src = init.name if init.name in tensors else None
        how = "name"
        if src is None:
            same = [n for n, t in tensors.items()
                    if (t.shape == arr.shape and np.array_equal(t, arr))
                    or (t.ndim == 2 and t.T.shape == arr.shape and np.array_equal(t.T, arr))]
            src, how = (same[0], "value") if len(same) == 1 else (None, "")
        if src is not None:
            mod = src.rsplit(".", 1)[0] if "." in src else ""
            group = group_of.get(src)
            if group is None:  # a buffer (BN running stats): its module's group
                group = module_group(mod)
        else:
            mod, group = None, None
            for node in consumers.get(init.name, []):
                mod = (_dynamo_module(node, modules) if exporter == "dynamo"
                       else _legacy_module(node.name, modules))
                if mod:
                    group = module_group(mod)
                    how = "node"
                    break
        entry.update(torch=src, module=mod, group=group, found_by=how)
        out[init.name] = entry
    return {"groups": {str(g): len(v) for g, v in groups.items()}, "last_group": max(group_of.values()),
            "group_matcher": {k: v if isinstance(v, str) else [list(x) for x in v]
                              for k, v in model.group_matcher(coarse=True).items()},
            "initializers": out}


def _strip(proto: onnx.ModelProto) -> None:
    for node in proto.graph.node:
        keep = [(p.key, p.value) for p in node.metadata_props if p.key == KEEP_META]
        del node.metadata_props[:]
        for k, v in keep:
            node.metadata_props.add(key=k, value=v)
        node.doc_string = ""


def main(argv):
    names = argv or list(MODELS)
    OUT.mkdir(parents=True, exist_ok=True)
    mpath = OUT / "MANIFEST.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {"fixtures": [], "exporter_failures": []}
    manifest["fixtures"] = [e for e in manifest["fixtures"] if e["model"] not in names]
    manifest["exporter_failures"] = [e for e in manifest["exporter_failures"] if e["model"] not in names]
    for name in names:
        for exporter in ("legacy", "dynamo"):
            shape, path = MODELS[name][1], OUT / f"{name}_{exporter}.onnx"
            try:
                model = build(name)  # EfficientFormer's attention biases fix its input at 224²
                export(model, shape, path, exporter)
                proto = onnx.load(str(path))
                ref = reference(model, proto, exporter)
                _strip(proto)
                onnx.save(proto, str(path))
                err = check(model, path, shape)
            except Exception as e:  # recorded, not hidden: the test skips nothing silently
                path.unlink(missing_ok=True)
                msg = " ".join(str(e).split())[:400]
                manifest["exporter_failures"].append({"model": name, "exporter": exporter,
                                                      "error": f"{type(e).__name__}: {msg}"})
                print(f"FAIL {name} {exporter}: {type(e).__name__}: {msg}", file=sys.stderr)
                continue
            unmapped = [k for k, v in ref["initializers"].items() if v["group"] is None]
            (OUT / f"{name}_{exporter}.json").write_text(json.dumps(ref, indent=1) + "\n")
            manifest["fixtures"].append({
                "file": path.name, "reference": f"{name}_{exporter}.json", "model": name,
                "timm_class": type(model).__name__, "exporter": exporter, "opset": OPSET[exporter],
                "torch": torch.__version__, "timm": timm.__version__, "onnx": onnx.__version__,
                "input": "x", "input_shape": ["batch", *shape], "params": sum(p.numel() for p in model.parameters()),
                "ort_vs_torch": err, "bytes": path.stat().st_size, "unmapped": unmapped,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
            print(f"ok   {name} {exporter}: {path.stat().st_size / 1e3:.0f} kB, ort vs torch {err:.1e}, "
                  f"{len(ref['initializers'])} initializers, unmapped {len(unmapped)}")
    manifest["fixtures"].sort(key=lambda e: (list(MODELS).index(e["model"]), e["exporter"]))
    mpath.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
