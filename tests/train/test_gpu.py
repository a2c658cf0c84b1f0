"""train.ctx: gpu refused before training on a card MXNet 1.9.1 has no code for, a CPU-only wheel
or a missing device. No machine here has a GPU: the message logic takes probe results built by
hand (the one stub the issue allows); the CPU-only case runs the real probe on this machine."""
from __future__ import annotations

from pathlib import Path

import pytest

from gluontl.errors import TrainError
from gluontl.train.gpu import GpuProbe, refusal, runs_on
from gluontl.train.loop import parse_ctx

REPO = Path(__file__).resolve().parents[2]
NO_KERNEL = "CUDA: no kernel image is available for execution on the device"  # cudaErrorNoKernelImageForDevice


@pytest.mark.parametrize("capability, runs", [
    ((3, 7), False), ((5, 0), True), ((5, 2), True), ((6, 1), True), ((7, 5), True), ((8, 0), True),
    ((8, 6), True), ((8, 9), True), ((9, 0), False), ((10, 0), False), ((12, 0), False)])
def test_wheel_code_runs_on_same_major_and_newer_minor_only(capability, runs):
    assert runs_on(capability) is runs


@pytest.mark.parametrize("capability", [(9, 0), (12, 0)])
def test_a_card_without_kernels_is_named_with_its_capability_and_the_wheels_range(capability):
    msg = refusal("gpu:0,1", 1, GpuProbe(cuda_build=True, visible=2, capability=capability, error=NO_KERNEL))
    for words in (f"GPU 1 has compute capability {capability[0]}.{capability[1]}", "train.ctx 'gpu:0,1'",
                  "5.0, 6.0, 7.0, 8.0, 8.6 only", "mxnet-cu110 … mxnet-cu117", "no PTX", "Hopper", "ctx: cpu",
                  NO_KERNEL):
        assert words in msg, words


def test_the_probe_error_decides_even_when_the_capability_is_unknown():
    msg = refusal("gpu:0", 0, GpuProbe(cuda_build=True, visible=1, capability=None, error=NO_KERNEL))
    assert "GPU 0 has an unknown compute capability, and no MXNet kernel can run on it" in msg


def test_a_supported_card_that_ran_the_probe_passes_and_other_failures_are_named():
    assert refusal("gpu:0", 0, GpuProbe(cuda_build=True, visible=1, capability=(8, 6))) is None
    msg = refusal("gpu:0", 0, GpuProbe(True, 1, (8, 6), "CUDA: out of memory"))
    assert "one-operation test on GPU 0 (compute capability 8.6) failed: CUDA: out of memory" in msg
    assert "no MXNet kernel" not in msg


def test_a_missing_device_names_the_visible_ones():
    msg = refusal("gpu:2", 2, GpuProbe(True, 2))
    assert "asks for GPU 2, but MXNet sees 2 GPU(s)" in msg and "gpu:0 to gpu:1 or ctx: cpu" in msg
    assert "MXNet sees 0 GPU(s)" in refusal("gpu:0", 0, GpuProbe(True, 0))


def test_cpu_only_wheel_is_refused_by_the_real_probe_with_install_advice():
    with pytest.raises(TrainError) as e:
        parse_ctx("gpu:0")  # this machine's mxnet is the CPU-only wheel
    for words in ("train.ctx 'gpu:0'", "CPU-only wheel", "pip install mxnet-cu117==1.9.1", "8.6 only", "ctx: cpu"):
        assert words in str(e.value), words


def test_gpu_is_refused_before_the_pretrain_is_made(tmp_path, monkeypatch):
    """ensure_weights would train weights_from first (minutes) and only then meet the card."""
    from gluontl.recipe import load_recipe
    from gluontl.train.loop import finetune

    pretrain = tmp_path / "pretrain.yaml"
    pretrain.write_text("name: tiny_pretrain\nmodel: {source: zoo:resnet18_v1, input_shape: [3, 16, 16]}\n"
                        "surgery: {head: {classes: 5}}\n"
                        "data: {source: demo:digits, classes: ['0', '1', '2', '3', '4'], batch_size: 32,\n"
                        "       train_transform: {resize: 16}, val_transform: {resize: 16}}\n"
                        "train: {epochs: 1, optimizer: sgd, lr: 0.05, seed: 0}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    recipe = load_recipe(REPO / "recipes" / "resnet18_freeze.yaml",
                         [f"model.weights_from={pretrain}", "model.weights=pre/w.params", "train.ctx=gpu:0"])
    with pytest.raises(TrainError, match=r"train.ctx 'gpu:0'.*CPU-only wheel"):  # this machine's wheel
        finetune(recipe, runs_root=tmp_path / "runs")
    assert not (tmp_path / "pre").exists() and not (tmp_path / "runs").exists()
