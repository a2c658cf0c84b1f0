"""Write tests/onnx/fixtures/: small real-architecture models exported by PyTorch.

The importer must handle the exact graphs PyTorch's exporters write (the legacy
TorchScript exporter at opsets 11-17, the dynamo exporter at opsets 18 and 20), not
only hand-made graphs. PyTorch is never a project dependency, so this runs in its own
venv (dynamo files embed this script's line numbers: regenerate after editing it):

    python3.11 -m venv /work/torchvenv
    /work/torchvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx==1.17.0 onnxscript onnxruntime
    /work/torchvenv/bin/python scripts/make_onnx_fixtures.py [MODEL ...]

With model names (keys of MODELS) only those are re-exported and the other files and
manifest entries stay as they are; MANIFEST.json records per file the torch (and
torchvision) version, the builder, the exporter options and the sha256. The files
before the torchvision models were made with torch 2.13.0 (CPU build); the ``tv_*``
and ``gru_crnn`` ones with torch 2.14.1 / torchvision 0.29.1; ``xcit_lpi``, ``mobilevit_fold``
and ``efficientformer_attn`` with torch 2.13.0 (CPU build, which ``pip install torch==2.13.0``
takes from this machine's disk; they need no torchvision).

Every export is checked against the torch model with onnxruntime at batch 1 and 2
(and at a second H/W where H/W are dynamic); an export that fails or computes the
wrong thing is recorded in MANIFEST.json under "exporter_failures" instead of a file.
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
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "onnx" / "fixtures"


# ------------------------------------------------------------------ building blocks

def conv_bn(cin, cout, k=3, s=1, groups=1, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act() if act else nn.Identity())


class SqueezeExcite(nn.Module):
    def __init__(self, c, r, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.fc1, self.act = nn.Conv2d(c, r, 1), act()
        self.fc2, self.gate = nn.Conv2d(r, c, 1), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


# ------------------------------------------------------------------ CNNs

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32, 1))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: expand 1x1, depthwise 3x3, linear projection."""

    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hid = cin * t
        layers = [conv_bn(cin, hid, 1, act=nn.ReLU6)] if t != 1 else []
        layers += [conv_bn(hid, hid, 3, stride, groups=hid, act=nn.ReLU6), conv_bn(hid, cout, 1, act=None)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        layers, cin = [conv_bn(3, 16, 3, 2, act=nn.ReLU6)], 16
        for t, c, n, s in [(1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 2, 2)]:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 64, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class MBv3Block(nn.Module):
    def __init__(self, cin, k, exp, cout, se, act, stride):
        super().__init__()
        layers = [conv_bn(cin, exp, 1, act=act)] if exp != cin else []
        layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, max(8, exp // 4), nn.ReLU, nn.Hardsigmoid))
        layers.append(conv_bn(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        re, hs = nn.ReLU, nn.Hardswish
        self.features = nn.Sequential(
            conv_bn(3, 16, 3, 2, act=hs), MBv3Block(16, 3, 16, 16, True, re, 2),
            MBv3Block(16, 3, 48, 24, False, re, 2), MBv3Block(24, 5, 64, 24, True, hs, 1),
            MBv3Block(24, 5, 72, 40, True, hs, 2), conv_bn(40, 96, 1, act=hs))
        self.classifier = nn.Sequential(nn.Linear(96, 128), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(128, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class MBConv(nn.Module):
    """EfficientNet block: SiLU everywhere, SE on the expanded channels."""

    def __init__(self, cin, cout, e, k, s):
        super().__init__()
        hid = cin * e
        self.block = nn.Sequential(
            *([conv_bn(cin, hid, 1, act=nn.SiLU)] if e != 1 else []),
            conv_bn(hid, hid, k, s, groups=hid, act=nn.SiLU),
            SqueezeExcite(hid, max(4, cin // 4), nn.SiLU, nn.Sigmoid),
            conv_bn(hid, cout, 1, act=None))
        self.residual = s == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class EfficientNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(3, 16, 3, 2, act=nn.SiLU), MBConv(16, 16, 1, 3, 1), MBConv(16, 24, 4, 3, 2),
            MBConv(24, 24, 4, 5, 1), MBConv(24, 40, 4, 5, 2), conv_bn(40, 96, 1, act=nn.SiLU))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(96, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def channel_shuffle(x, groups):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride, half = stride, cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                         conv_bn(cin, half, 1))
        c = cin if stride > 1 else half
        self.branch2 = nn.Sequential(conv_bn(c, half, 1), conv_bn(half, half, 3, stride, groups=half,
                                                                  act=None), conv_bn(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = conv_bn(3, 24, 3, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.stage2 = nn.Sequential(ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1))
        self.stage3 = nn.Sequential(ShuffleUnit(48, 96, 2), ShuffleUnit(96, 96, 1))
        self.conv5 = conv_bn(96, 128, 1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.stage3(self.stage2(self.maxpool(self.conv1(x))))
        return self.fc(self.conv5(x).mean([2, 3]))


class Fire(nn.Module):
    def __init__(self, cin, squeeze, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1x1(x)), F.relu(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(32, 8, 16, 16), Fire(32, 8, 16, 16), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(32, 12, 24, 24))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(48, classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class XBlock(nn.Module):
    """RegNetX block: 1x1, grouped 3x3 (group width 8), 1x1, projected shortcut."""

    def __init__(self, cin, cout, stride, gw=8):
        super().__init__()
        self.f = nn.Sequential(conv_bn(cin, cout, 1), conv_bn(cout, cout, 3, stride, groups=cout // gw),
                               conv_bn(cout, cout, 1, act=None))
        self.proj = None if stride == 1 and cin == cout else conv_bn(cin, cout, 1, stride, act=None)

    def forward(self, x):
        return F.relu((x if self.proj is None else self.proj(x)) + self.f(x))


class RegNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2)
        self.trunk = nn.Sequential(XBlock(16, 24, 2), XBlock(24, 48, 2), XBlock(48, 48, 1))
        self.fc = nn.Linear(48, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.trunk(self.stem(x)), 1).flatten(1))


class DenseLayer(nn.Module):
    """Pre-activation (BN before conv), so BatchNormalization nodes survive the export."""

    def __init__(self, cin, growth):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        y = self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))
        return torch.cat([x, y], 1)


class DenseNet(nn.Module):
    def __init__(self, classes=10, growth=8):
        super().__init__()
        layers, c = [nn.Conv2d(3, 16, 3, 1, 1, bias=False)], 16
        for block in range(2):
            for _ in range(3):
                layers.append(DenseLayer(c, growth))
                c += growth
            if block == 0:
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), (1, 1)), 1))


# ------------------------------------------------------------------ transformers

class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class ViTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, classes=10, dim=48, patch=8, size=32):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(ViTBlock(dim, 3), ViTBlock(dim, 3))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class EncoderViT(nn.Module):
    """ViT from nn.TransformerEncoderLayer (batch-first, pre-norm): attention through
    torch's own MultiheadAttention / scaled_dot_product_attention, as most user code has it."""

    def __init__(self, classes=10, dim=32, patch=8, size=32):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        return self.head(self.encoder(x).mean(1))


def window_partition(x, ws):
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, c)


def window_reverse(windows, ws, b, h, w):
    """With ``b=None`` the batch is recovered as the original Swin code does; both
    exporters freeze that ``int(...)`` to the example batch (recorded as an exporter
    failure), so the exported variant takes it from the caller."""
    if b is None:
        b = int(windows.shape[0] / (h * w / ws / ws))
    x = windows.view(b, h // ws, w // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


class WindowAttention(nn.Module):
    """Swin attention: relative position bias gathered from a table by a fixed index."""

    def __init__(self, dim, ws, heads):
        super().__init__()
        self.ws, self.heads, self.scale = ws, heads, (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * ws - 1) + rel[..., 1])
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b_, n, c = x.shape
        qkv = self.qkv(x).reshape(b_, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        attn = attn + bias.view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(b_ // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b_, n, c))


class SwinBlock(nn.Module):
    def __init__(self, dim, res, heads, ws, shift, int_batch):
        super().__init__()
        self.res, self.ws, self.shift, self.int_batch = res, ws, shift, int_batch
        self.norm1, self.attn = nn.LayerNorm(dim), WindowAttention(dim, ws, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        mask = None
        if shift:
            img = torch.zeros(1, res, res, 1)
            cnt = 0
            for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img[:, hs, wsl, :] = cnt
                    cnt += 1
            win = window_partition(img, ws).view(-1, ws * ws)
            mask = win.unsqueeze(1) - win.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        self.register_buffer("attn_mask", mask)

    def forward(self, x):
        h = w = self.res
        b, l, c = x.shape
        y = self.norm1(x).view(b, h, w, c)
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = window_partition(y, self.ws).view(-1, self.ws * self.ws, c)
        y = window_reverse(self.attn(y, self.attn_mask).view(-1, self.ws, self.ws, c), self.ws,
                           None if self.int_batch else b, h, w)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + y.view(b, h * w, c)
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    def __init__(self, classes=10, dim=32, int_batch=False):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 4, 4)
        self.patch_norm = nn.LayerNorm(dim)
        self.blocks = nn.Sequential(*(SwinBlock(dim, 8, 2, 4, shift, int_batch) for shift in (0, 2)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_norm(self.patch_embed(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(self.blocks(x)).mean(1))


class LayerNorm2d(nn.Module):
    """ConvNeXt's channels-first LayerNorm, written out with means over dim 1."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c)), eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 4, 4), LayerNorm2d(24))
        self.stage1 = nn.Sequential(ConvNeXtBlock(24), ConvNeXtBlock(24))
        self.downsample = nn.Sequential(LayerNorm2d(24), nn.Conv2d(24, 48, 2, 2))
        self.stage2 = nn.Sequential(ConvNeXtBlock(48))
        self.norm, self.head = nn.LayerNorm(48, eps=1e-6), nn.Linear(48, classes)

    def forward(self, x):
        x = self.stage2(self.downsample(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean([-2, -1])))


# ------------------------------------------------------------------ YOLOv8-style detector

def cbs(cin, cout, k=1, s=1):
    return conv_bn(cin, cout, k, s, act=nn.SiLU)


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut):
        super().__init__()
        self.cv1, self.cv2, self.add = cbs(c, c, 3), cbs(c, c, 3), shortcut

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C2f(nn.Module):
    def __init__(self, cin, cout, n=1, shortcut=True):
        super().__init__()
        self.c = cout // 2
        self.cv1, self.cv2 = cbs(cin, 2 * self.c), cbs((2 + n) * self.c, cout)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).split((self.c, self.c), 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, cin, cout, k=5):
        super().__init__()
        self.cv1, self.cv2 = cbs(cin, cin // 2), cbs(cin // 2 * 4, cout)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    """Decoupled head; DFL softmax over reg_max bins, anchors from the feature shapes."""

    def __init__(self, nc, ch, strides, reg_max=8):
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, strides
        self.cv2 = nn.ModuleList(nn.Sequential(cbs(c, 16, 3), cbs(16, 16, 3), nn.Conv2d(16, 4 * reg_max, 1))
                                 for c in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(cbs(c, 16, 3), cbs(16, 16, 3), nn.Conv2d(16, nc, 1))
                                 for c in ch)
        self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1)

    def forward(self, feats):
        b = feats[0].shape[0]
        x = [torch.cat((a(f), c(f)), 1) for f, a, c in zip(feats, self.cv2, self.cv3)]
        anchors, strides = [], []
        for f, s in zip(feats, self.strides):
            h, w = f.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h, dtype=torch.float) + 0.5,
                                    torch.arange(w, dtype=torch.float) + 0.5, indexing="ij")
            anchors.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(s)))
        anchors, strides = torch.cat(anchors).transpose(0, 1), torch.cat(strides).transpose(0, 1)
        x = torch.cat([xi.view(b, 4 * self.reg_max + self.nc, -1) for xi in x], 2)
        box, cls = x.split((4 * self.reg_max, self.nc), 1)
        a = box.shape[2]
        dist = self.dfl(box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = anchors.unsqueeze(0) - lt, anchors.unsqueeze(0) + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)


class YOLOv8(nn.Module):
    def __init__(self, nc=4):
        super().__init__()
        self.stem = nn.Sequential(cbs(3, 8, 3, 2), cbs(8, 16, 3, 2), C2f(16, 16))
        self.down3 = nn.Sequential(cbs(16, 32, 3, 2), C2f(32, 32))
        self.down4 = nn.Sequential(cbs(32, 48, 3, 2), C2f(48, 48), SPPF(48, 48))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n3 = C2f(80, 32, shortcut=False)
        self.down_n = cbs(32, 32, 3, 2)
        self.n4 = C2f(80, 48, shortcut=False)
        self.detect = Detect(nc, (32, 48), (8, 16))

    def forward(self, x):
        p3 = self.down3(self.stem(x))
        p4 = self.down4(p3)
        n3 = self.n3(torch.cat((self.up(p4), p3), 1))
        n4 = self.n4(torch.cat((self.down_n(n3), p4), 1))
        return self.detect([n3, n4])


# ------------------------------------------------------------------ CRNN

class CRNN(nn.Module):
    """Text recognizer: conv stack to a width-wise sequence, BiLSTM, per-step log-probs."""

    def __init__(self, classes=11):
        super().__init__()
        self.cnn = nn.Sequential(
            conv_bn(1, 16, 3), nn.MaxPool2d(2), conv_bn(16, 32, 3), nn.MaxPool2d(2),
            conv_bn(32, 48, 3), nn.MaxPool2d((2, 1)), nn.Conv2d(48, 48, (4, 1)), nn.ReLU())
        self.rnn = nn.LSTM(48, 32, bidirectional=True)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        seq = self.cnn(x).squeeze(2).permute(2, 0, 1)  # (width, batch, channels)
        out, _ = self.rnn(seq)
        return F.log_softmax(self.fc(out), dim=2)


# ------------------------------------------------------------------ torchvision architectures
# torchvision's own classes at tiny widths/depths (random weights): their forward code
# (StochasticDepth, LayerNorm2d, Permute, as_strided pooling, shifted-window masks,
# F.interpolate to the input size) is what users' exports contain.

def tv_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt as TVConvNeXt
    return TVConvNeXt([CNBlockConfig(24, 48, 2), CNBlockConfig(48, None, 1)], stochastic_depth_prob=0.1,
                      num_classes=10)


def tv_efficientnet():
    from torchvision.models.efficientnet import EfficientNet as TVEfficientNet, MBConvConfig
    setting = [MBConvConfig(1, 3, 1, 16, 8, 1), MBConvConfig(4, 3, 2, 8, 16, 2), MBConvConfig(4, 5, 2, 16, 24, 1)]
    return TVEfficientNet(setting, dropout=0.2, num_classes=10)


def tv_regnet():
    from torchvision.models.regnet import BlockParams, RegNet as TVRegNet
    params = BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return TVRegNet(params, num_classes=10, stem_width=16)


def tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                             mlp_dim=64, num_classes=10)


def tv_swin():
    from torchvision.models import swin_transformer as sw
    return sw.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 1], num_heads=[2, 2],
                              window_size=[4, 4], num_classes=10)


class Outputs(nn.Module):
    """Segmentation models return dicts; ONNX exports need a tuple (or one tensor)."""

    def __init__(self, model, keys=("out",)):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, x):
        out = self.model(x)
        return tuple(out[k] for k in self.keys) if len(self.keys) > 1 else out[self.keys[0]]


def _tiny_mobilenetv3_features():
    """torchvision's MobileNetV3 trunk with a 4-block setting: SE, hardswish, a stride-8
    block (low/aux features) and a dilated last block (output stride 16, as torchvision's
    segmentation constructors ask with ``dilated=True``); returns the trunk and the
    positions of the stride-8 and last layers."""
    from torchvision.models.mobilenetv3 import InvertedResidualConfig as Cfg, MobileNetV3 as TVMobileNetV3
    setting = [Cfg(8, 3, 8, 8, True, "RE", 2, 1, 1.0), Cfg(8, 3, 24, 12, False, "RE", 2, 1, 1.0),
               Cfg(12, 5, 32, 12, True, "HS", 2, 1, 1.0), Cfg(12, 5, 36, 12, True, "HS", 1, 2, 1.0)]
    features = TVMobileNetV3(setting, last_channel=64).features
    return features, 2, len(features) - 1


def tv_lraspp():
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.lraspp import LRASPP
    features, low, high = _tiny_mobilenetv3_features()
    backbone = IntermediateLayerGetter(features, return_layers={str(low): "low", str(high): "high"})
    return Outputs(LRASPP(backbone, features[low].out_channels, features[high].out_channels, 5,
                          inter_channels=16))


def tv_fcn():
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.fcn import FCN, FCNHead
    features, aux, out = _tiny_mobilenetv3_features()
    backbone = IntermediateLayerGetter(features, return_layers={str(aux): "aux", str(out): "out"})
    return Outputs(FCN(backbone, FCNHead(features[out].out_channels, 5),
                       FCNHead(features[aux].out_channels, 5)), ("out", "aux"))


def tv_deeplabv3():
    """DeepLabHead's layers (ASPP, 3x3 conv, BN, ReLU, 1x1 conv) at 16 instead of 256 channels."""
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.deeplabv3 import ASPP, DeepLabV3
    features, _, out = _tiny_mobilenetv3_features()
    backbone = IntermediateLayerGetter(features, return_layers={str(out): "out"})
    head = nn.Sequential(ASPP(features[out].out_channels, (2, 4, 6), 16), conv_bn(16, 16, 3),
                         nn.Conv2d(16, 5, 1))
    return Outputs(DeepLabV3(backbone, head))


class GRUCRNN(CRNN):
    """CRNN with a 2-layer bidirectional GRU (the other recurrent cell OCR models use)."""

    def __init__(self, classes=11):
        super().__init__(classes)
        self.rnn = nn.GRU(48, 16, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(32, classes)


class BatchIndexing(nn.Module):
    """Batch-size arithmetic both exporters turn into Range/Tile over the batch:
    advanced indexing with ``arange(B)``, a flat gather at ``arange(B) * n + k``, a mask
    from ``arange(B)``, ``repeat(B, 1)``, an ``arange(B * c)`` feature, and in-place writes
    (``y[:, 0] = 0``, ``index_put`` at ``arange(B)``: ScatterElements / ScatterND)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv, self.fc = conv_bn(3, 8, 3, 2), nn.Linear(56, classes)

    def forward(self, x):
        t = self.conv(x).flatten(2).transpose(1, 2)  # (B, 64, 8)
        b, n, c = t.shape
        rows = torch.arange(b)
        picked = t[rows, t[:, :, 0].argmax(1)]
        flat = t.reshape(b * n, c)[rows * n + 3]
        masked = torch.where(rows[:, None] % 2 == 0, picked, -picked)
        shared = t.mean(1)[:1].repeat(b, 1)
        ramp = torch.arange(b * c).reshape(b, c).float() * 0.01
        written = t.clone()
        written[:, 0] = 0
        put = torch.zeros_like(picked).index_put((rows, torch.zeros(b, dtype=torch.long)), flat[:, 1])
        return self.fc(torch.cat([picked, flat, masked, shared, ramp, written.mean(1), put], 1))


# ------------------------------------------------------------------ attention folded into convolutions
# The first layer of each that MXNet 1.9.1's oneDNN could not train (issue 23): a convolution
# whose input is attention output reshaped back into an image.

class XCiTLPI(nn.Module):
    """XCiT's local patch interaction: tokens → LayerNorm → transpose/reshape to an image →
    depthwise 3x3 conv (group = channels) → GELU → BN → depthwise 3x3 → tokens again."""

    def __init__(self, classes=10, c=16):
        super().__init__()
        self.patch = nn.Conv2d(3, c, 4, 4)
        self.norm = nn.LayerNorm(c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.patch(x)
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        y = self.norm(t).transpose(1, 2).reshape(b, c, h, w)
        y = self.conv2(self.bn(F.gelu(self.conv1(y))))
        t = t + y.reshape(b, c, h * w).transpose(1, 2)
        return self.head(t.mean(1))


class MobileViTFold(nn.Module):
    """MobileViT block: local convs, unfold into 2x2 patches, one attention layer over the
    patches, fold back (reshape/transpose) and the 1x1 projection conv, then fuse."""

    def __init__(self, classes=10, c=8, d=16, p=2):
        super().__init__()
        self.p = p
        self.stem = conv_bn(3, c, 3, 2)
        self.local = nn.Sequential(conv_bn(c, c, 3), nn.Conv2d(c, d, 1, bias=False))
        self.norm = nn.LayerNorm(d)
        self.attn = Attention(d, heads=2)
        self.proj = conv_bn(d, c, 1)
        self.fuse = conv_bn(2 * c, c, 3)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.local(x)
        b, d, h, w = y.shape
        p, nh, nw = self.p, h // self.p, w // self.p
        t = y.reshape(b * d * nh, p, nw, p).transpose(1, 2).reshape(b, d, nh * nw, p * p)
        t = t.transpose(1, 3).reshape(b * p * p, nh * nw, d)
        t = t + self.attn(self.norm(t))
        y = t.reshape(b, p * p, nh * nw, d).transpose(1, 3).reshape(b * d * nh, nw, p, p)
        y = y.transpose(1, 2).reshape(b, d, h, w)
        y = self.fuse(torch.cat([x, self.proj(y)], 1))
        return self.head(y.mean((2, 3)))


class EfficientFormerAttn(nn.Module):
    """EfficientFormerV2's Attention4D: 1x1-conv q/k/v, softmax(q k^T) v → transpose →
    reshape to an image → + depthwise local v → GELU → 1x1 projection conv + BN."""

    def __init__(self, classes=10, c=16, heads=2, kd=8):
        super().__init__()
        self.heads, self.kd, self.dv = heads, kd, c // heads
        self.stem = conv_bn(3, c, 3, 2)
        self.q = conv_bn(c, heads * kd, 1, act=None)
        self.k = conv_bn(c, heads * kd, 1, act=None)
        self.v = conv_bn(c, c, 1, act=None)
        self.v_local = conv_bn(c, c, 3, groups=c, act=None)
        self.proj = nn.Sequential(nn.GELU(), nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        b, c, h, w = x.shape
        n = h * w
        q = self.q(x).flatten(2).reshape(b, self.heads, self.kd, n).permute(0, 1, 3, 2)
        k = self.k(x).flatten(2).reshape(b, self.heads, self.kd, n)
        v = self.v(x)
        local = self.v_local(v)
        v = v.flatten(2).reshape(b, self.heads, self.dv, n).permute(0, 1, 3, 2)
        attn = (q @ k * self.kd ** -0.5).softmax(-1)
        y = (attn @ v).transpose(2, 3).reshape(b, c, h, w) + local
        return self.head((x + self.proj(y)).mean((2, 3)))


# ------------------------------------------------------------------ export

# name: (constructor, input shape at batch 1, legacy opsets, output batch axis)
MODELS = {
    "resnet": (ResNet, (3, 32, 32), (13,), 0),
    "mobilenetv2": (MobileNetV2, (3, 32, 32), (11, 13), 0),
    "mobilenetv3": (MobileNetV3, (3, 32, 32), (13, 17), 0),
    "efficientnet": (EfficientNet, (3, 32, 32), (13,), 0),
    "shufflenetv2": (ShuffleNetV2, (3, 32, 32), (11, 13), 0),
    "squeezenet": (SqueezeNet, (3, 32, 32), (13,), 0),
    "regnet": (RegNet, (3, 32, 32), (13,), 0),
    "densenet": (DenseNet, (3, 32, 32), (13,), 0),
    "vit": (ViT, (3, 32, 32), (13, 17), 0),
    "encoder_vit": (EncoderViT, (3, 32, 32), (14, 17), 0),
    "swin": (Swin, (3, 32, 32), (13, 17), 0),
    "swin_int_batch": (partial(Swin, int_batch=True), (3, 32, 32), (17,), 0),
    "convnext": (ConvNeXt, (3, 32, 32), (13, 17), 0),
    "yolov8": (YOLOv8, (3, 64, 64), (11, 17), 0),
    "crnn": (CRNN, (1, 32, 64), (11, 13), 1),
    "tv_convnext": (tv_convnext, (3, 64, 64), (17,), 0),
    "tv_efficientnet": (tv_efficientnet, (3, 64, 64), (17,), 0),
    "tv_regnet": (tv_regnet, (3, 64, 64), (17,), 0),
    "tv_vit": (tv_vit, (3, 32, 32), (17,), 0),
    "tv_swin": (tv_swin, (3, 64, 64), (17,), 0),
    "tv_lraspp": (tv_lraspp, (3, 64, 64), (17,), 0),
    "tv_fcn": (tv_fcn, (3, 64, 64), (17,), 0),
    "tv_deeplabv3": (tv_deeplabv3, (3, 64, 64), (17,), 0),
    "gru_crnn": (GRUCRNN, (1, 32, 64), (17,), 1),
    "batch_indexing": (BatchIndexing, (3, 16, 16), (17,), 0),
    "xcit_lpi": (XCiTLPI, (3, 16, 16), (17,), 0),
    "mobilevit_fold": (MobileViTFold, (3, 16, 16), (17,), 0),
    "efficientformer_attn": (EfficientFormerAttn, (3, 16, 16), (17,), 0),
}
DYNAMO_OPSETS = {"vit": (18, 20), "convnext": (18, 20),  # default (18,); 20 has a Gelu op
                 "efficientformer_attn": (18, 20)}
# Legacy exports without constant folding keep BatchNormalization and torch's weight names.
NO_FOLDING = {"resnet"}
# Why an expected exporter failure happens (kept next to its error in the manifest).
EXPORTER_NOTES = {"swin_int_batch": "window_reverse's int(windows.shape[0] / (h * w / ws / ws)) is traced "
                                    "as the example batch (2), so other batch sizes mix samples"}
# Free H/W too; tested at these sizes. Segmentation models are exported with free H/W only
# (their output follows the input size through F.interpolate).
DYNAMIC_HW = {"resnet": (3, 40, 48), "yolov8": (3, 96, 64), "tv_lraspp": (3, 96, 80),
              "tv_fcn": (3, 96, 80), "tv_deeplabv3": (3, 80, 96)}
SEGMENTATION = {"tv_lraspp", "tv_fcn", "tv_deeplabv3"}
OUTPUT_NAMES = {"tv_fcn": ("y", "aux")}


def build(name):
    """The model with a fixed-seed init, non-trivial norm affines and BN running stats."""
    ctor, shape = MODELS[name][:2]
    torch.manual_seed(0)
    model = ctor()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, LayerNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
        for p in model.parameters():  # zero-initialized heads (torchvision's ViT) output nothing
            if p.ndim >= 2 and not p.any():
                p.normal_(0, 0.1)
        model.train()
        for _ in range(3):
            model(torch.randn(4, *shape) * 2 + 0.3)
    return model.eval()


def export(model, x, path, *, name, dynamo, opset, dyn_dims, folding):
    """One export to ``path``."""
    dims = {0: "batch", **{k: ("height", "width")[k - 2] for k in dyn_dims if k >= 2}}
    out_dims = {MODELS[name][3]: "batch", **({2: "height", 3: "width"} if dyn_dims and name in SEGMENTATION
                                             else {})}
    outputs = OUTPUT_NAMES.get(name, ("y",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            d = {k: torch.export.Dim(v, min=1 if k == 0 else 16, max=64 if k == 0 else 256)
                 for k, v in dims.items()}
            prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=opset,
                                     dynamic_shapes={"x": d}, input_names=["x"])
            prog.save(str(path))
        else:
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=opset,
                              input_names=["x"], output_names=list(outputs), do_constant_folding=folding,
                              dynamic_axes={"x": dims, **{o: out_dims for o in outputs}})


def check(model, path, shapes):
    """Largest relative error of onnxruntime vs torch over the given input shapes and
    outputs; raises naming the input shape where they disagree."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for shape in shapes:
        x = torch.from_numpy(np.random.RandomState(len(shape) + shape[0]).randn(*shape).astype("f"))
        with torch.no_grad():
            refs = model(x)
        refs = [r.numpy() for r in (refs if isinstance(refs, tuple) else (refs,))]
        gots = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        if len(gots) != len(refs):
            raise RuntimeError(f"onnxruntime gives {len(gots)} outputs, torch {len(refs)}")
        for got, ref in zip(gots, refs):
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if got.shape == ref.shape else np.inf
            if not err <= 1e-4:
                raise RuntimeError(f"at input {list(shape)} onnxruntime gives shape {got.shape}, relative "
                                   f"error {err:.2e} vs torch's {ref.shape} output")
            worst = max(worst, err)
    return worst


def jobs(names):
    """(model, exporter, opset, dynamic dims beyond the batch, constant folding, file stem)."""
    for name in names:
        opsets = MODELS[name][2]
        dynamo_opsets = DYNAMO_OPSETS.get(name, (18,))
        variants = [] if name in SEGMENTATION else (
            [("legacy", o, ()) for o in opsets] + [("dynamo", o, ()) for o in dynamo_opsets])
        if name in DYNAMIC_HW:
            variants += [("legacy", opsets[-1], (2, 3)), ("dynamo", dynamo_opsets[0], (2, 3))]
        for exporter, opset, dyn in variants:
            yield name, exporter, opset, dyn, True, f"{name}_{exporter}_op{opset}" + "_dynhw" * bool(dyn)
        if name in NO_FOLDING:
            yield name, "legacy", opsets[0], (), False, f"{name}_legacy_op{opsets[0]}_nofold"


def _strip_debug_info(path):
    """Drop the dynamo exporter's per-node stack traces and doc strings (half of a small
    file's bytes); the graph is unchanged."""
    proto = onnx.load(str(path))
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(proto, str(path))


def _builder(name) -> str:
    ctor = MODELS[name][0]
    if isinstance(ctor, partial):
        args = ", ".join(f"{k}={v!r}" for k, v in ctor.keywords.items())
        return f"{ctor.func.__name__}({args})"
    return f"{ctor.__name__}()"


def main(argv):
    """No arguments: every model; else only the named ones (their files and manifest
    entries are replaced, the others' kept)."""
    names = argv or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "MANIFEST.json"
    old = json.loads(path.read_text()) if argv and path.exists() else {"fixtures": [], "exporter_failures": []}
    manifest = {"fixtures": [e for e in old["fixtures"] if e["model"] not in names],
                "exporter_failures": [e for e in old["exporter_failures"] if e["model"] not in names]}
    for e in manifest["fixtures"]:
        e.setdefault("sha256", hashlib.sha256((OUT / e["file"]).read_bytes()).hexdigest())
    for stale in OUT.glob("*.onnx"):
        if stale.name not in {e["file"] for e in manifest["fixtures"]}:
            stale.unlink()
    for name, exporter, opset, dyn_dims, folding, stem in jobs(names):
        model, shape = build(name), MODELS[name][1]
        path = OUT / f"{stem}.onnx"
        shapes = [(1, *shape), (2, *shape)] + ([(2, *DYNAMIC_HW[name])] if dyn_dims else [])
        try:
            export(model, torch.randn(2, *shape), path, name=name, dynamo=exporter == "dynamo", opset=opset,
                   dyn_dims=dyn_dims, folding=folding)
            _strip_debug_info(path)
            err = check(model, path, shapes)
        except Exception as e:
            path.unlink(missing_ok=True)
            msg = " ".join(str(e).split())[:400]
            manifest["exporter_failures"].append({"model": name, "exporter": exporter, "opset": opset,
                                                  "error": f"{type(e).__name__}: {msg}",
                                                  "cause": EXPORTER_NOTES.get(name, "")})
            print(f"FAIL {stem}: {type(e).__name__}: {msg}", file=sys.stderr)
            continue
        proto = onnx.load(str(path))
        inits = {t.name for t in proto.graph.initializer}
        inp = proto.graph.input[0]
        entry = {
            "file": path.name, "model": name, "builder": _builder(name), "exporter": exporter,
            "opset": opset, "torch": torch.__version__, "onnx": onnx.__version__,
            "ir_version": proto.ir_version,
            "constant_folding": folding, "input": inp.name,
            "input_shape": [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim],
            "dynamic_dims": [0, *dyn_dims],
            "test_shapes": [list(s) for s in shapes],
            "torch_names": sorted(set(model.state_dict()) & inits),
            "ort_vs_torch": err, "bytes": path.stat().st_size, "debug_info_stripped": True,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        if name.startswith("tv_"):
            import torchvision
            entry["torchvision"] = torchvision.__version__
        manifest["fixtures"].append(entry)
        print(f"ok   {stem}: {path.stat().st_size / 1e3:.0f} kB, ort vs torch {err:.1e}")
    manifest["fixtures"].sort(key=lambda e: list(MODELS).index(e["model"]))  # stable
    (OUT / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
