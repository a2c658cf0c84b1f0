"""data.sampler balanced / sqrt: exact class quotas per epoch, determinism per (seed, epoch), resume
mid-epoch, disjoint and covering shards; bad input named by its key."""
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from gluontl.data.balance import ClassSampler, class_sampler, class_shares, quotas
from gluontl.data.datasets import make_loaders
from gluontl.data.sampler import EpochSampler
from gluontl.errors import DataError
from gluontl.recipe import DataSpec
from tests import helpers

COUNTS = (9, 4, 1)  # an imbalanced split: sqrt shares 3/6, 2/6, 1/6 by hand


def labels(counts=COUNTS):
    rng = np.random.default_rng(7)
    return rng.permutation(np.repeat(np.arange(len(counts)), counts))


def sampler(mode="balanced", seed=5, batch_size=4, last_batch="keep", counts=COUNTS):
    return ClassSampler(labels(counts), batch_size, mode=mode, seed=seed, num_classes=len(counts),
                        last_batch=last_batch)


def test_quotas_by_hand():
    assert quotas(14, class_shares(np.array(COUNTS), "balanced")).tolist() == [5, 5, 4]  # 4.67 each; ties: lowest
    assert quotas(14, class_shares(np.array(COUNTS), "sqrt")).tolist() == [7, 5, 2]  # 7, 4.67, 2.33
    assert quotas(14, class_shares(np.array(COUNTS), "uniform")).tolist() == list(COUNTS)
    assert quotas(10, np.full(3, 1 / 3)).tolist() == [4, 3, 3]


@pytest.mark.parametrize("mode, quota", [("balanced", [5, 5, 4]), ("sqrt", [7, 5, 2])])
def test_every_epoch_draws_the_exact_quotas_evenly_within_a_class(mode, quota):
    s, y = sampler(mode), labels()
    for epoch in range(6):
        order = s.order(epoch)
        assert len(order) == sum(COUNTS)
        assert np.bincount(y[order], minlength=3).tolist() == quota
        for c, q in enumerate(quota):  # each image of a class floor(q / n_c) or ceil(q / n_c) times
            seen = np.bincount(order, minlength=len(y))[y == c]
            assert seen.min() == q // COUNTS[c] and seen.max() == -(-q // COUNTS[c]), (c, seen)


def test_frequencies_over_many_epochs_follow_the_weights():
    """Per image, the long-run rate is its class's quota / its class's count: floor(q / n) draws each
    epoch plus one more with probability (q mod n) / n (binomial over epochs: within 5 standard deviations)."""
    epochs, s, y = 400, sampler("sqrt"), labels()
    hits = sum(np.bincount(s.order(e), minlength=len(y)) for e in range(epochs))
    q, n = np.array([7, 5, 2])[y], np.array(COUNTS)[y]  # the quotas by hand (test_quotas_by_hand)
    extra = (q % n) / n
    want = epochs * (q // n + extra)
    assert np.all(np.abs(hits - want) <= 5 * np.sqrt(epochs * extra * (1 - extra))), (hits, want)
    assert hits.sum() == epochs * len(y) and hits[y == 2].tolist() == [2 * epochs]  # the 1-image class: exactly


def test_order_is_a_pure_function_of_seed_and_epoch():
    a, b = sampler(seed=5), sampler(seed=5)
    b.order(3)  # reading another epoch first changes nothing
    for e in range(4):
        np.testing.assert_array_equal(a.order(e), b.order(e))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), sampler(seed=6).order(0))
    a.set_epoch(2)
    keys = [k for batch in a for k in batch]
    assert [i for i, _ in keys] == a.order(2).tolist() and {e for _, e in keys} == {2}


def test_resume_mid_epoch_yields_the_rest_of_the_same_epoch():
    full = sampler()
    full.set_epoch(3)
    batches = list(full)
    assert len(batches) == 4 and len(batches[-1]) == 2  # 14 = 3 x 4 + 2, last_batch keep
    resumed = sampler()
    resumed.set_epoch(3)
    resumed.skip(2)
    assert len(resumed) == 2 and list(resumed) == batches[2:]
    assert list(resumed) == batches  # the skip holds for one iteration only


# 14 images in batches of 2: 2 workers keep all (3 steps of 4, then 2, one each); 3 workers train 2 steps of
# 6 and leave 2 out under discard, and under keep too (a last step of 2 would leave a worker without an image)
@pytest.mark.parametrize("workers, last_batch, trained", [(2, "keep", 14), (3, "discard", 12), (3, "keep", 12),
                                                          (2, "discard", 12)])
def test_shards_are_disjoint_and_cover_the_trained_order(workers, last_batch, trained):
    ref = sampler(batch_size=2, last_batch=last_batch)
    ref.shard(0, workers)
    ref.set_epoch(1)
    order = ref.order(1)
    assert sum(COUNTS) - ref.left_out() == trained
    shards = []
    for rank in range(workers):
        s = sampler(batch_size=2, last_batch=last_batch)
        s.shard(rank, workers)
        s.set_epoch(1)
        shards.append([i for batch in s for i, _ in batch])
        assert s.batches_per_epoch() == ref.batches_per_epoch()  # the same number of steps each
    # positions rank, rank + workers, ... of the one order: disjoint positions, together the trained head
    positions = sorted(p for rank in range(workers) for p in range(rank, trained, workers))
    assert positions == list(range(trained))
    for rank, got in enumerate(shards):
        assert got == order[:trained][rank::workers].tolist()
    assert sorted(sum(shards, [])) == sorted(order[:trained].tolist())


def test_class_with_no_image_is_refused_by_key():
    y = np.array([0, 0, 2, 2, 0])
    with pytest.raises(DataError, match=r"data\.sampler: balanced .* class\(es\) 'b' have no image in the split"):
        class_sampler(y, ["a", "b", "c"], mode="balanced", batch_size=2, seed=0, last_batch="keep",
                      where="the split")
    with pytest.raises(DataError, match="data.sampler: sqrt samples by one class per image"):
        class_sampler(np.zeros((4, 3)), ["a", "b", "c"], mode="sqrt", batch_size=2, seed=0, last_batch="keep",
                      where="x")


def _folder(root: Path, counts: dict[str, int]) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c, n in counts.items():
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n if split == "train" else 2):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), np.uint8)).save(root / split / c / f"{i}.png")
    return root


def test_loaders_train_on_the_class_sampler(tmp_path):
    root = _folder(tmp_path, {"a": 9, "b": 4, "c": 1})
    base = {"source": f"folder:{root}", "batch_size": 4, "last_batch": "keep",
            "train_transform": {"resize": 8}, "val_transform": {"resize": 8}}
    plain = make_loaders(DataSpec(**base), seed=5, which=("train",))
    assert type(plain.train_sampler) is EpochSampler
    loaders = make_loaders(DataSpec(**base, sampler="balanced"), seed=5, which=("train",))
    assert isinstance(loaders.train_sampler, ClassSampler)
    got = np.concatenate([y.asnumpy() for _, y in loaders.train_epoch(2)]).astype(int)
    assert np.bincount(got).tolist() == [5, 5, 4]


def test_plan_shows_weights_and_refuses_an_empty_class(tmp_path, capsys):
    root = _folder(tmp_path / "d", {"a": 9, "b": 4, "c": 0})
    (root / "val" / "c").mkdir(exist_ok=True)
    (tmp_path / "m").mkdir()
    prefix = helpers.tiny_symbol(tmp_path / "m")
    recipe = helpers.tiny_recipe(prefix, data={"source": f"folder:{root}", "classes": ["a", "b", "c"],
                                              "train_transform": {"resize": 16}, "val_transform": {"resize": 16},
                                              "sampler": "balanced", "on_bad_image": "skip"})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    helpers.assert_one_paragraph(code, out, err, ["data.sampler: balanced", "'c' have no image",
                                                  f"the train split 'train' of folder:{root}"])
    (root / "train" / "c" / "x.png").write_bytes((root / "train" / "a" / "0.png").read_bytes())
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    assert code == 0, err
    flat = " ".join(out.split())
    assert ("data.sampler balanced: per-class sampling weights (share of each epoch's draws): a 0.333 (9 images, "
            "5 draws), b 0.333 (4 images, 5 draws), c 0.333 (1 image, 4 draws)") in flat, flat


def test_class_weights_of_the_wrong_length_name_the_file_and_key(tmp_path, capsys):
    recipe = helpers.tiny_recipe("p", loss={"kind": "focal", "class_weights": [1, 2, 3]})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    helpers.assert_one_paragraph(code, out, err, [str(path), "train.loss.class_weights lists 3 weights",
                                                  "data.classes makes 5 classes"])


def test_sampler_and_loss_are_classifications():
    from gluontl.recipe import parse_recipe

    with pytest.raises(Exception, match="train.loss and data.sampler are for task: classification"):
        parse_recipe({"name": "s", "task": "segmentation", "model": {"source": "zoo:resnet18_v1b"},
                      "data": {"source": "demo:digits_seg", "sampler": "sqrt"}})
