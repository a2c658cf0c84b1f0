"""Shards that never hang a synchronous job: every worker gets the same number of equal batches,
and the workers' batch b together is batch b of one process with workers x batch_size."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import helpers
from gluontl.detect.data import make_detection_loaders
from gluontl.recipe import DataSpec
from gluontl.data.datasets import make_loaders
from gluontl.data.sampler import EpochSampler


def _keys(sampler, epoch, skip=0):
    sampler.set_epoch(epoch)
    sampler.skip(skip)
    return [[i for i, _ in b] for b in sampler]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(1, 200), st.integers(1, 9), st.integers(1, 5), st.integers(0, 3), st.booleans(),
       st.sampled_from(["keep", "discard"]))
def test_shards_are_disjoint_in_step_and_add_up_to_the_combined_batches(n, batch, workers, epoch, shuffle, last):
    shards = []
    for rank in range(workers):
        s = EpochSampler(n, batch, seed=7, shuffle=shuffle, last_batch=last)
        s.shard(rank, workers)
        shards.append(_keys(s, epoch))
    whole, rest = divmod(n, batch * workers)
    kept = last == "keep" and rest >= workers  # a smaller last step that gives every worker an item
    steps = whole + kept
    left = 0 if kept else rest
    assert s.left_out() == left
    want = _keys(EpochSampler(n, batch * workers, seed=7, shuffle=shuffle, last_batch=last), epoch)
    for got in shards:  # equal steps (a synchronous job hangs otherwise), whole batches but the kept rest
        assert len(got) == steps and all(len(b) == batch for b in got[:whole]) and all(got)
    for b in range(steps):
        together = [i for got in shards for i in got[b]]
        assert sorted(together) == sorted(want[b])  # the same images as one process's step b
        assert len(set(together)) == len(together)
    trained = [i for got in shards for b in got for i in b]
    order = s.order(epoch).tolist()
    assert sorted(trained) == sorted(order[:n - left])  # each image at most once; the left-out are the tail
    assert len(trained) + left == n


def test_skip_resumes_every_shard_at_the_same_step():
    s = EpochSampler(100, 4, seed=1, last_batch="discard")
    s.shard(1, 3)
    full = _keys(s, 2)
    assert _keys(s, 2, skip=5) == full[5:]
    assert len(full) == 100 // 12


def test_shard_refuses_a_rank_outside_the_job():
    with pytest.raises(ValueError, match="rank 2 is not one of 2 workers"):
        EpochSampler(10, 2, seed=0).shard(2, 2)


def test_the_order_of_an_epoch_never_changes():
    """Pinned orders: checkpoints of existing runs resume mid-epoch in this order, so a change of the
    stream tag, of the seed's reduction or of numpy's permutation would silently replay other images."""
    s = EpochSampler(12, 4, seed=1000)  # shuffles by default
    epoch0 = [4, 2, 11, 6, 3, 1, 10, 8, 5, 0, 7, 9]
    assert s.order().tolist() == s.order(0).tolist() == epoch0  # a new sampler is at epoch 0
    assert [b for b in s] == [[(i, 0) for i in epoch0[k:k + 4]] for k in (0, 4, 8)]
    epoch3 = [4, 7, 5, 3, 2, 10, 1, 0, 11, 6, 8, 9]
    assert s.order(3).tolist() == epoch3  # any epoch's order, whichever epoch is set
    s.set_epoch(3)
    assert s.order().tolist() == epoch3 and _keys(s, 3)[0] == epoch3[:4]
    # seeds count modulo 2**64 (numpy takes no negative seed): -1 is 2**64 - 1, 2**64 is 0
    for seed in (-1, 2**64 - 1):
        assert EpochSampler(12, 4, seed=seed).order(2).tolist() == [10, 9, 2, 1, 6, 3, 0, 4, 8, 5, 7, 11]
    assert EpochSampler(12, 4, seed=2**64 + 1000).order(0).tolist() == epoch0
    assert EpochSampler(12, 4, seed=1000, shuffle=False).order(3).tolist() == list(range(12))


@pytest.mark.parametrize("n, batch, last, workers, per_epoch", [
    (7, 3, "keep", 1, 3), (7, 3, "discard", 1, 2), (6, 3, "keep", 1, 2),
    (2, 3, "keep", 1, 1), (2, 3, "discard", 1, 0),  # fewer images than a batch
    (100, 4, "keep", 3, 9), (100, 4, "discard", 3, 8), (97, 4, "keep", 3, 8),  # shards: a rest of 4, of 1
    (5, 3, "keep", 2, 1), (5, 3, "discard", 2, 0), (1, 3, "keep", 2, 0)])  # fewer images than a step, than workers
@pytest.mark.parametrize("skip", [0, 1, 2, 8, 9])
def test_len_is_the_number_of_batches_the_next_iteration_yields(n, batch, last, workers, per_epoch, skip):
    s = EpochSampler(n, batch, seed=0, last_batch=last)
    s.shard(workers - 1, workers)
    s.skip(skip)
    want = max(0, per_epoch - skip)  # skipped to or past the end: nothing left
    assert len(s) == want
    assert len(list(s)) == want
    assert len(s) == len(list(s)) == per_epoch  # the skip applied to one iteration


def test_an_unknown_last_batch_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^last_batch must be 'keep' or 'discard', got 'drop'$"):
        EpochSampler(10, 2, seed=0, last_batch="drop")


def _shard_names(loaders, dataset, workers):
    """Every rank's items of epoch 1, by name, through the real DataLoader."""
    names = []
    for rank in range(workers):
        loaders.train_sampler.shard(rank, workers)
        names.append([[dataset.name(i) if hasattr(dataset, "name") else i for i in keys]
                      for keys in _keys(loaders.train_sampler, 1)])
    return names


@pytest.mark.parametrize("kind", ["classification", "detection"])
def test_every_task_s_loaders_shard_through_the_sampler(kind, tmp_path):
    """Both tasks' training loaders are driven by the shardable sampler (folder, list, rec and demo
    sources all go through make_loaders; detection's VOC/COCO/YOLO through its own)."""
    if kind == "classification":
        spec = DataSpec(source="demo:digits", classes=["5", "6"], batch_size=8)
        loaders = make_loaders(spec, seed=0, which=("train",))
    else:
        spec = DataSpec(source=f"voc:{helpers.voc_subset(tmp_path, 40, 4)}", batch_size=8)
        loaders = make_detection_loaders(spec, (3, 64, 64), seed=0, which=("train",))
    assert loaders.train._batch_sampler is loaders.train_sampler
    ds = loaders.train._dataset
    names = _shard_names(loaders, ds, 2)
    assert len(names[0]) == len(names[1]) == loaders.train_size // 16
    flat = [[k for b in r for k in b] for r in names]
    assert not set(map(str, flat[0])) & set(map(str, flat[1]))
    # the shard decides which batches come out of the DataLoader itself
    loaders.train_sampler.shard(1, 2)
    loaders.train_sampler.set_epoch(1)
    assert sum(1 for _ in loaders.train) == len(names[1])
    np.testing.assert_equal(len(names[1][0]), 8)
