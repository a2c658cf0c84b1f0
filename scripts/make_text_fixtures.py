"""Write tests/onnx/fixtures/text/: a small 2-layer BERT-style text encoder exported by PyTorch.

Text encoders bring what the vision fixtures lack: int64 ``input_ids`` and ``attention_mask``
with a free batch *and* sequence length, a 30,522-row embedding Gather (BERT's vocabulary),
position ids from ``arange(S)``, an attention mask broadcast through Unsqueeze/Expand into a
Where on the scores, LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div below opset 17,
LayerNormalization from 17), Softmax, erf GELU and MatMul on 3-D and 4-D operands, and masked
mean pooling. The module is hand-built (no ``transformers``), hidden size 8 to keep each file
near 1 MB. torch is never a project dependency; run with the torch venv:

    /work/venvs/torch/bin/python scripts/make_text_fixtures.py

MANIFEST.json records per file the exporter, opset, torch/onnx versions, onnxruntime-vs-torch
error and sha256. Dynamo files embed this script's line numbers only as debug info, stripped.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "onnx" / "fixtures" / "text"
VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAX_POS = 30522, 8, 2, 16, 2, 64
# (exporter, opset): the legacy exporter decomposes LayerNorm below 17; dynamo translates at 18
# and version-converts down to 17 (asked for 14-16 it silently writes 18, so those are legacy's)
JOBS = [("legacy", 14), ("legacy", 17), ("dynamo", 17), ("dynamo", 18)]
SHAPES = [(1, 7), (2, 7), (2, 12)]  # (batch, sequence): both free


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.attn_out, self.attn_norm = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
        self.intermediate, self.output = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
        self.out_norm = nn.LayerNorm(HIDDEN, eps=1e-12)

    def forward(self, x, keep):
        b, s, _ = x.shape
        d = HIDDEN // HEADS

        def heads(t):
            return t.view(b, s, HEADS, d).transpose(1, 2)  # [B, H, S, d]
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # 4-D MatMul
        scores = torch.where(keep.expand(b, HEADS, s, s), scores, torch.full_like(scores, -1e4))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))  # erf GELU


class TinyBert(nn.Module):
    """BERT's encoder in small: word + position embeddings, LayerNorm, 2 post-norm layers,
    masked mean pooling over the tokens the mask keeps."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(MAX_POS, HIDDEN)
        self.embed_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        x = self.embed_norm(self.word_embeddings(input_ids) + self.position_embeddings(pos))
        keep = (attention_mask[:, None, None, :] != 0)  # [B, 1, 1, S], expanded per layer
        for layer in self.layers:
            x = layer(x, keep)
        m = attention_mask.unsqueeze(-1).to(x.dtype)
        return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)


def build() -> TinyBert:
    torch.manual_seed(0)
    model = TinyBert()
    with torch.no_grad():  # BERT's init scale for the embeddings; LayerNorm affine off unity
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def tokens(batch: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids across the whole vocabulary; later rows padded (mask 0) over their last tokens."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, VOCAB, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    for i in range(1, batch):
        mask[i, seq - 2 * i:] = 0
    return ids, mask


def export(model, path: Path, exporter: str, opset: int) -> None:
    ids, mask = (torch.from_numpy(a) for a in tokens(2, 7, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            b, s = torch.export.Dim("batch"), torch.export.Dim("sequence", max=MAX_POS)
            prog = torch.onnx.export(model, (ids, mask), dynamo=True, opset_version=opset,
                                     input_names=["input_ids", "attention_mask"], output_names=["pooled"],
                                     dynamic_shapes={"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}})
            prog.save(str(path))
        else:
            axes = {0: "batch", 1: "sequence"}
            torch.onnx.export(model, (ids, mask), str(path), dynamo=False, opset_version=opset,
                              input_names=["input_ids", "attention_mask"], output_names=["pooled"],
                              dynamic_axes={"input_ids": axes, "attention_mask": axes, "pooled": {0: "batch"}})
    proto = onnx.load(str(path))
    for node in proto.graph.node:  # dynamo's stack traces: half a small file's bytes
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(proto, str(path))


def check(model, path: Path) -> float:
    """Largest relative error of onnxruntime vs torch over SHAPES; raises naming the bad ones."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    errs = {}
    for batch, seq in SHAPES:
        ids, mask = tokens(batch, seq, batch + seq)
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        errs[(batch, seq)] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if got.shape == ref.shape else np.inf
    bad = {k: v for k, v in errs.items() if not v <= 1e-5}
    if bad:
        raise RuntimeError(f"{path.name}: onnxruntime differs from torch at (batch, sequence): {bad}")
    return max(errs.values())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    model = build()
    fixtures = []
    for exporter, opset in JOBS:
        path = OUT / f"tinybert_{exporter}_op{opset}.onnx"
        export(model, path, exporter, opset)
        err = check(model, path)
        proto = onnx.load(str(path))
        written = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        if written != opset:
            raise RuntimeError(f"{path.name}: asked for opset {opset}, the exporter wrote {written}")
        ops = sorted({n.op_type for n in proto.graph.node})
        fixtures.append({"file": path.name, "exporter": exporter, "opset": opset, "torch": torch.__version__,
                         "onnx": onnx.__version__, "inputs": ["input_ids", "attention_mask"],
                         "vocab": VOCAB, "hidden": HIDDEN, "heads": HEADS, "layers": LAYERS, "max_positions": MAX_POS,
                         "test_shapes": [list(s) for s in SHAPES], "op_types": ops,
                         "torch_names": sorted(set(model.state_dict()) & {t.name for t in proto.graph.initializer}),
                         "ort_vs_torch": err, "bytes": path.stat().st_size,
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
        print(f"ok   {path.name}: {path.stat().st_size / 1e3:.0f} kB, ort vs torch {err:.1e}, ops {ops}")
    (OUT / "MANIFEST.json").write_text(json.dumps({"fixtures": fixtures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
    sys.exit(0)
