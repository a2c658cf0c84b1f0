"""Mixup / CutMix on a 2-image batch checked by hand (lambda, the box, timm's area correction, smoothed
soft targets), the pair and elem modes, the soft loss against numpy, the refusals, and a run on the
feature cache that resumes exactly."""
import json

import mxnet as mx
import numpy as np
import pytest
from tests import helpers

from gluontl.data.mixup import mix_batch, mix_rng, mixup_target
from gluontl.errors import TrainError
from gluontl.recipe import MixupSpec, parse_recipe
from gluontl.tasks.classification import _SOFT_CE, classify
from gluontl.train.loop import finetune

SMOOTH = 0.1
C = 3
OFF, ON = SMOOTH / C, 1 - SMOOTH + SMOOTH / C  # timm's smoothed one-hot: 0.0333, 0.9333


def _pair(shape=(3, 8, 10)):
    """Two images whose every value differs (so lambda can be read back from any mixed value)."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, shape).astype(np.float32)
    return np.stack([a, a + 2.0]), np.array([0, 2])


def test_mixup_on_two_images_by_hand():
    x, y = _pair()
    for seed in range(5):
        out, target, lams = mix_batch(x, y, MixupSpec(mixup_alpha=0.8), C, SMOOTH, mix_rng(seed, 1, 2))
        lam = float((out[0] - x[1]).ravel()[0] / (x[0] - x[1]).ravel()[0])  # out0 = lam x0 + (1 - lam) x1
        assert 0 < lam < 1 and lams.tolist() == pytest.approx([lam, lam], abs=1e-5)
        np.testing.assert_allclose(out[0], lam * x[0] + (1 - lam) * x[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[1], lam * x[1] + (1 - lam) * x[0], rtol=1e-5, atol=1e-5)
        y0, y2 = np.array([ON, OFF, OFF]), np.array([OFF, OFF, ON])
        np.testing.assert_allclose(target[0], lam * y0 + (1 - lam) * y2, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(target[1], lam * y2 + (1 - lam) * y0, rtol=1e-5, atol=1e-6)
        again = mix_batch(x, y, MixupSpec(mixup_alpha=0.8), C, SMOOTH, mix_rng(seed, 1, 2))
        np.testing.assert_array_equal(again[0], out)  # a pure function of (seed, epoch, batch)


def test_cutmix_on_two_images_by_hand_with_timms_area_correction():
    h, w = 8, 10
    x = np.stack([np.zeros((3, h, w), np.float32), np.ones((3, h, w), np.float32)])
    y = np.array([1, 0])
    boxes = 0
    for seed in range(12):
        out, target, lams = mix_batch(x, y, MixupSpec(mixup_alpha=0.0, cutmix_alpha=1.0), C, SMOOTH,
                                      mix_rng(seed, 0, 0))
        pasted = np.argwhere(out[0, 0] == 1)  # image 0 got image 1's box, and the reverse
        np.testing.assert_array_equal(out[1], 1 - out[0])
        area = len(pasted)
        if area:
            boxes += 1
            (y0, x0), (y1, x1) = pasted.min(0), pasted.max(0) + 1
            assert area == (y1 - y0) * (x1 - x0)  # one rectangle
            assert (out[0, :, y0:y1, x0:x1] == 1).all()
        lam = 1 - area / (h * w)  # corrected: the share left of image 0
        assert lams.tolist() == pytest.approx([lam, lam])
        y1h, y0h = np.array([OFF, ON, OFF]), np.array([ON, OFF, OFF])
        np.testing.assert_allclose(target[0], lam * y1h + (1 - lam) * y0h, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(target[1], lam * y0h + (1 - lam) * y1h, rtol=1e-6, atol=1e-7)
    assert boxes >= 8


def test_cutmix_box_sides_follow_the_uncorrected_lambda():
    """timm's rand_bbox: sides int(H sqrt(1 - lam)) and int(W sqrt(1 - lam)) around the centre, clipped; an
    unclipped box (centre far enough inside) has sides 2 * (side // 2)."""
    h, w = 40, 50
    x = np.stack([np.zeros((1, h, w), np.float32), np.ones((1, h, w), np.float32)])
    spec = MixupSpec(mixup_alpha=0.0, cutmix_alpha=1.0, correct_lam=False)
    for seed in range(20):
        rng = mix_rng(seed, 0, 0)
        out, _, lams = mix_batch(x, np.array([0, 1]), spec, 2, 0.0, rng)
        pasted = np.argwhere(out[0, 0] == 1)
        lam = lams[0]  # not corrected: the Beta draw itself
        ch, cw = int(h * np.sqrt(1 - lam)), int(w * np.sqrt(1 - lam))
        if len(pasted):
            (y0, x0), (y1, x1) = pasted.min(0), pasted.max(0) + 1
            assert y1 - y0 <= 2 * (ch // 2) and x1 - x0 <= 2 * (cw // 2)
            if 0 < y0 and y1 < h and 0 < x0 and x1 < w:
                assert (y1 - y0, x1 - x0) == (2 * (ch // 2), 2 * (cw // 2))


def test_pair_and_elem_modes_mix_each_image_with_its_mirror():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (4, 2, 3, 3)).astype(np.float32) + np.arange(4, dtype=np.float32)[:, None, None, None] * 3
    y = np.array([0, 1, 2, 1])
    out, target, lams = mix_batch(x, y, MixupSpec(mixup_alpha=1.0, mode="pair"), C, 0.0, mix_rng(0, 0, 0))
    for i, j in ((0, 3), (1, 2)):
        assert lams[i] == lams[j]
        np.testing.assert_allclose(out[i], lams[i] * x[i] + (1 - lams[i]) * x[j], rtol=1e-5)
        np.testing.assert_allclose(out[j], lams[j] * x[j] + (1 - lams[j]) * x[i], rtol=1e-5)
    np.testing.assert_allclose(target, mixup_target(y, C, lams, 0.0))
    out, target, lams = mix_batch(x, y, MixupSpec(mixup_alpha=1.0, mode="elem"), C, 0.0, mix_rng(0, 0, 0))
    assert len(set(np.round(lams, 6))) == 4  # one lambda per image
    for i in range(4):
        np.testing.assert_allclose(out[i], lams[i] * x[i] + (1 - lams[i]) * x[3 - i], rtol=1e-5)
    np.testing.assert_allclose(target.sum(1), 1.0, rtol=1e-6)


def test_prob_zero_leaves_the_batch_and_smooths_the_targets():
    x, y = _pair()
    out, target, lams = mix_batch(x, y, MixupSpec(mixup_alpha=1.0, prob=0.0), C, SMOOTH, mix_rng(0, 0, 0))
    np.testing.assert_array_equal(out, x)
    np.testing.assert_allclose(target, [[ON, OFF, OFF], [OFF, OFF, ON]], rtol=1e-6)


def test_soft_loss_is_the_mixed_cross_entropy():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, -0.3]], np.float32)
    target = mixup_target(np.array([0, 2]), C, 0.7, SMOOTH)
    losses, hits = classify(lambda v: v, [mx.nd.array(logits)], [mx.nd.array(target)], _SOFT_CE)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(losses[0].asnumpy(), -(target * logp).sum(1), rtol=1e-5)
    assert int(hits[0].asscalar()) == 1  # row 0: class 0 has the larger share and the largest logit


def test_cutmix_on_flat_cached_features_is_refused_before_training():
    from gluontl.data.cache import Decision, check_mixing
    from gluontl.recipe import TrainSpec

    t = TrainSpec(mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0})
    with pytest.raises(TrainError, match="train.mixup.cutmix_alpha is 1, but with the feature cache"):
        check_mixing(t, Decision(True, 1, ""), (1, 1280))
    check_mixing(t, Decision(True, 1, ""), (1, 192, 7, 7))  # a feature map: boxes on its 7 x 7 grid
    check_mixing(t, Decision(False, 0, ""), (1, 1280))  # no cache: the images are mixed
    check_mixing(TrainSpec(mixup={"mixup_alpha": 0.8}), Decision(True, 1, ""), (1, 1280))


def test_cutmix_on_flat_features_is_refused_by_key():
    with pytest.raises(TrainError, match="train.mixup.cutmix_alpha"):
        mix_batch(np.ones((4, 6), np.float32), np.array([0, 1, 0, 1]), MixupSpec(mixup_alpha=0, cutmix_alpha=1.0),
                  2, 0.0, mix_rng(0, 0, 0))
    out, _, _ = mix_batch(np.ones((4, 6), np.float32), np.array([0, 1, 0, 1]), MixupSpec(), 2, 0.0, mix_rng(0, 0, 0))
    assert out.shape == (4, 6)  # mixup itself is fine on flat features


@pytest.mark.parametrize("recipe_file, key", [("recipes/detect_digits_ssd.yaml", "train.mixup"),
                                              ("recipes/segment_digits.yaml", "data.train_transform.randaugment"),
                                              ("recipes/elpv_efficientnet_lite0.yaml", "randaugment.m")])
def test_bad_input_exits_2_naming_the_key(recipe_file, key, tmp_path, capsys):
    import yaml

    r = yaml.safe_load(open(recipe_file))
    if key == "train.mixup":
        r["train"]["mixup"] = {"mixup_alpha": 0.8}
    else:
        r["data"].setdefault("train_transform", {})["randaugment"] = {"n": 2, "m": 12 if key.endswith(".m") else 9}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    helpers.assert_one_paragraph(code, out, err, [key])


def test_on_the_feature_cache_the_features_mix_and_a_resume_is_exact(tmp_path):
    """A frozen conv0 (cached, one augmented view with RandAugment and erasing), mixup + CutMix on its
    (N, 8, 16, 16) features: the run trains, and stopped after 3 steps and resumed it is the same run."""
    prefix = helpers.tiny_symbol(tmp_path)
    data = {"train_transform": {"resize": 16, "flip": True, "randaugment": {"n": 2, "m": 9},
                                "random_erasing": {"prob": 0.5}}}
    r = parse_recipe(helpers.tiny_recipe(
        prefix, data=data, export=[], rules=[{"match": "*", "grad_req": "null"},
                                             {"match": ["conv1*", "dense0*"], "grad_req": "write"}],
        epochs=1, lr=0.05, log_every=1, cache_features="on", cache_views=1, prefix_engine="mxnet",
        label_smoothing=0.1, mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mode": "elem"}))
    whole = finetune(r, runs_root=tmp_path / "a", quiet=True)
    assert json.loads((whole.run_dir / "summary.json").read_text())["feature_cache"]["cache"]
    part = finetune(r, runs_root=tmp_path / "b", quiet=True, stop_after_steps=3)
    resumed = finetune(r, resume=part.run_dir, quiet=True)
    assert helpers.without_timings(resumed.metrics) == helpers.without_timings(whole.metrics)
    epochs = [m for m in whole.metrics if "epoch" in m]
    assert len(epochs) == 1 and all(np.isfinite(m["train_loss"]) for m in epochs)
