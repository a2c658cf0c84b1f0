"""Data-parallel fine-tuning on MXNet's parameter server, on loopback: 1 scheduler, 1 server,
2 workers started by `gluontl launch`, checked against one process training on the combined batch.

The reference is gluontl's own single-process loop, whose numbers tests/train checks against
handwritten Gluon steps; here what is checked is that two workers compute what one process does.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
import yaml
from mxnet.gluon import nn

from tests import helpers
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune

DATA = {**helpers.DIGITS_5_9, "classes": ["5", "6"], "batch_size": 16}  # 9 steps of 2 x 16 per epoch
FROZEN, NO_LR = ("c1_weight", "c1_bias"), "c2_bias"
BN_STATS = ("bn1_running_mean", "bn1_running_var", "bn2_running_mean", "bn2_running_var")


@pytest.fixture(scope="module")
def tiny_bn(tmp_path_factory):
    """A small conv net with BatchNorm whose statistics are not 0/1, as a symbol checkpoint."""
    folder = tmp_path_factory.mktemp("tinybn")
    mx.random.seed(2)
    net = nn.HybridSequential(prefix="")
    net.add(nn.Conv2D(8, 3, padding=1, prefix="c1_"), nn.BatchNorm(prefix="bn1_"), nn.Activation("relu"),
            nn.MaxPool2D(2), nn.Conv2D(16, 3, padding=1, prefix="c2_"), nn.BatchNorm(prefix="bn2_"),
            nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Dense(2, prefix="fc_"))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 16, 16)))
    rs = np.random.RandomState(0)
    for name, p in net.collect_params().items():
        if name.endswith("running_mean"):
            p.set_data(mx.nd.array(rs.uniform(-0.2, 0.2, p.shape)))
        elif name.endswith("running_var"):
            p.set_data(mx.nd.array(rs.uniform(0.5, 2.0, p.shape)))
    net.hybridize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    net.export(str(folder / "tinybn"))
    return str(folder / "tinybn")


def recipe(prefix, *, distributed=None, rules=(), batch_size=16, **train):
    return helpers.tiny_recipe(
        prefix, name="d", export=[], data={**DATA, "batch_size": batch_size},
        rules=[{"match": list(FROZEN), "grad_req": "null"}, {"match": [NO_LR], "lr_mult": 0.0}, *rules],
        **{"epochs": 1, "lr": 0.05, "log_every": 1, "seed": 3, "guards": "off",
           **({"distributed": distributed} if distributed else {}), **train})


def launch(tmp_path, recipe_dict, *args, workers=2, servers=1):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_dict))
    cmd = [sys.executable, "-m", "gluontl", "launch", "-n", str(workers), "--servers", str(servers), "--",
           "finetune", "--recipe", str(path),
           "--runs", str(tmp_path / "runs"), "-q", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def run_folder(proc, tmp_path):
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run,) = (tmp_path / "runs").iterdir()
    return run


def initial(prefix):
    return {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{prefix}-0000.params").items()}


def step_losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_two_workers_match_one_process_on_the_combined_batch_three_times(tiny_bn, tmp_path):
    """Three jobs, because MXNet 1.9.1's lazy first-step broadcast races the first gradient push
    (7 of 11 runs went wrong without the broadcast done before training)."""
    ref = finetune(parse_recipe(recipe(tiny_bn, batch_size=32, rules=[{"type": ["BatchNorm"], "bn": "frozen"}])),
                   runs_root=tmp_path / "ref", quiet=True)
    want, start = helpers.checkpoint_params(ref.run_dir), initial(tiny_bn)
    # job 0: the feature cache in memory-mapped files (one per worker); job 1: two servers (the keys
    # of gluontl's own collectives must map to a server; MXNet computes that in int32); job 2: each
    # worker splits its batch over two contexts
    variants = [({"cache_max_bytes": 1}, 1), ({}, 2), ({"ctx": "cpu:0,1"}, 1)]
    for rep, (train, servers) in enumerate(variants):
        run = run_folder(launch(tmp_path / str(rep), recipe(tiny_bn, distributed={"backend": "kvstore"}, **train),
                                servers=servers), tmp_path / str(rep))
        sums = {(run / "logs" / f"worker-{r}.sha256").read_text() for r in (0, 1)}
        assert len(sums) == 1, f"repetition {rep}: the workers' parameters differ"
        got = helpers.checkpoint_params(run)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=f"rep {rep}: {name}")
        for name in (*FROZEN, NO_LR, *BN_STATS):  # frozen, lr_mult 0, frozen BN statistics: not a bit moved
            np.testing.assert_array_equal(got[name], start[name], err_msg=f"rep {rep}: {name}")
        assert not np.array_equal(got["c2_weight"], start["c2_weight"])
        np.testing.assert_allclose(step_losses(run), step_losses(ref.run_dir), rtol=0, atol=1e-6)
        assert len(step_losses(run)) == 9
        plan = json.loads((run / "plan.json").read_text())
        bn = {p["name"]: p for p in plan["params"] if p["name"].startswith("bn")}
        assert all(p["bn"] == "frozen" and p["decided_by"]["bn"] == "train.distributed.batch_norm"
                   for p in bn.values()), bn
        assert "rank 1" in (run / "logs" / "worker-1.log").read_text()


def test_a_kept_last_batch_trains_every_image_and_matches_one_process(tiny_bn, tmp_path):
    """291 training images: whole batches only leave 3 out each epoch, and the plan says so;
    data.last_batch: keep trains them in a smaller last step, on 2 workers (2 + 1 images) as on
    one process with the combined batch."""
    def keep(r):
        return {**r, "data": {**r["data"], "last_batch": "keep"}}

    bn_frozen = [{"type": ["BatchNorm"], "bn": "frozen"}]
    dropped = finetune(parse_recipe(recipe(tiny_bn, batch_size=32, rules=bn_frozen)), runs_root=tmp_path / "drop",
                       quiet=True, stop_after_steps=1)
    data = json.loads((dropped.run_dir / "plan.json").read_text())["epoch_data"]
    assert (data["train_images"], data["batches"], data["left_out"]) == (291, 9, 3)
    assert "291 training images, 9 batches of 32 per epoch; 3 left out each epoch" in \
        (dropped.run_dir / "plan.txt").read_text()
    ref = finetune(parse_recipe(keep(recipe(tiny_bn, batch_size=32, rules=bn_frozen))),
                   runs_root=tmp_path / "ref", quiet=True)
    assert json.loads((ref.run_dir / "plan.json").read_text())["epoch_data"]["left_out"] == 0
    assert len(step_losses(ref.run_dir)) == 10  # 9 x 32 + 3
    run = run_folder(launch(tmp_path / "job", keep(recipe(tiny_bn, distributed={"backend": "kvstore"}))),
                     tmp_path / "job")
    data = json.loads((run / "plan.json").read_text())["epoch_data"]
    assert (data["workers"], data["batches"], data["left_out"]) == (2, 10, 0)
    assert len({(run / "logs" / f"worker-{r}.sha256").read_text() for r in (0, 1)}) == 1
    got, want = helpers.checkpoint_params(run), helpers.checkpoint_params(ref.run_dir)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(step_losses(run), step_losses(ref.run_dir), rtol=0, atol=1e-6)


def test_a_stopped_and_resumed_job_matches_an_uninterrupted_one(tiny_bn, tmp_path):
    r = recipe(tiny_bn, distributed={"backend": "kvstore", "batch_norm": "rank0"}, epochs=2)
    full = run_folder(launch(tmp_path / "full", r), tmp_path / "full")
    stopped = launch(tmp_path / "part", r, "--stop-after-steps", "4")
    part = run_folder(stopped, tmp_path / "part")
    assert f"continue with `gluontl launch -n 2 -- finetune --resume {part}`" in stopped.stdout
    meta = json.loads((part / "checkpoints" / "last.json").read_text())
    assert (meta["epoch"], meta["batch_in_epoch"], meta["workers"]) == (0, 4, 2)
    resumed = launch(tmp_path / "part", r, "--resume", str(part))
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    a, b = helpers.checkpoint_params(full), helpers.checkpoint_params(part)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert step_losses(full) == step_losses(part)
    # batch_norm: rank0: the statistics moved, and every worker holds rank 0's
    assert not np.array_equal(a["bn2_running_mean"], initial(tiny_bn)["bn2_running_mean"])
    assert len({(part / "logs" / f"worker-{r}.sha256").read_text() for r in (0, 1)}) == 1


def test_a_run_stopped_on_2_workers_resumes_on_1_with_the_same_global_batch(tiny_bn, tmp_path):
    """Elastic resume: 2 workers × 16 stop after 4 steps, 1 worker × 32 continues; one process on 32
    is the reference. Only the order in which each step's 32 per-image gradients are added differs
    (the servers add two partial sums, one process adds one batch): per step the sums agree within
    float32's summation bound (32 − 1)·u·Σ|g|, u = 2⁻²⁴; 1e-6 as for 2 workers against one process."""
    bn_frozen = [{"type": ["BatchNorm"], "bn": "frozen"}]
    ref = finetune(parse_recipe(recipe(tiny_bn, batch_size=32, rules=bn_frozen, epochs=2)),
                   runs_root=tmp_path / "ref", quiet=True)
    r = recipe(tiny_bn, distributed={"backend": "kvstore"}, epochs=2)
    part = run_folder(launch(tmp_path / "part", r, "--stop-after-steps", "4"), tmp_path / "part")
    resumed = launch(tmp_path / "part", r, "--resume", str(part), workers=1)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert "resuming on 1 worker(s) a run trained on 2: data.batch_size 32 per worker, 32 images a step" in \
        resumed.stdout
    meta = json.loads((part / "checkpoints" / "last.json").read_text())
    assert (meta["workers"] if "workers" in meta else 1, meta["global_batch"]) == (1, 32)
    got, want = helpers.checkpoint_params(part), helpers.checkpoint_params(ref.run_dir)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(step_losses(part), step_losses(ref.run_dir), rtol=0, atol=1e-6)
    assert yaml.safe_load((part / "recipe.yaml").read_text())["data"]["batch_size"] == 16  # the run's recipe


def test_a_worker_count_that_does_not_divide_the_global_batch_is_refused_by_name(tiny_bn, tmp_path):
    from gluontl.errors import TrainError
    from gluontl.train.elastic import rebatch

    r = parse_recipe(recipe(tiny_bn, distributed={"backend": "kvstore"}))
    assert rebatch(tmp_path, r, {"workers": 2}, 4).data.batch_size == 8
    assert rebatch(tmp_path, r, {"workers": 1, "global_batch": 32}, 2).data.batch_size == 16
    with pytest.raises(TrainError, match=r"on 3 worker\(s\): it was trained on 2 with a global batch of 32 images "
                                         r"a step \(2 × data.batch_size 16\).*divides 32 \(1, 2, 4, 8, 16, 32\)"):
        rebatch(tmp_path, r, {"workers": 2}, 3)


def test_horovod_workers_match_one_process_on_the_combined_batch(tiny_bn, tmp_path):
    """Only where Horovod is built (scripts/build_horovod.sh, about 5 minutes: not in CI's set-up)."""
    pytest.importorskip("horovod.mxnet")
    ref = finetune(parse_recipe(recipe(tiny_bn, batch_size=32, rules=[{"type": ["BatchNorm"], "bn": "frozen"}])),
                   runs_root=tmp_path / "ref", quiet=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(tiny_bn, distributed={"backend": "horovod"})))
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    proc = subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", "--network-interface", "lo",
                           sys.executable, "-m", "gluontl", "finetune", "--recipe", str(path), "--runs",
                           str(tmp_path / "runs"), "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    run = run_folder(proc, tmp_path)
    assert len({(run / "logs" / f"worker-{r}.sha256").read_text() for r in (0, 1)}) == 1
    got, want, start = helpers.checkpoint_params(run), helpers.checkpoint_params(ref.run_dir), initial(tiny_bn)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    for name in (*FROZEN, NO_LR, *BN_STATS):
        np.testing.assert_array_equal(got[name], start[name], err_msg=name)
    np.testing.assert_allclose(step_losses(run), step_losses(ref.run_dir), rtol=0, atol=1e-6)


def test_a_detector_trains_on_two_workers(tmp_path):
    """Detection plugs into the same loop: equal shards of augmented images, bit-identical workers,
    frozen stages untouched. (SSD's loss is normalized by each worker's own positive anchors, as in
    GluonCV's distributed scripts, so it does not equal one process on the combined batch.)"""
    voc = helpers.voc_subset(tmp_path, 24, 24)
    r = {"name": "det", "task": "detection", "model": {"source": "zoo:ssd_300_mobilenet0.25_custom",
                                                       "input_shape": [3, 128, 128]},
         "rules": [{"preset": "freeze_until_stage", "until_stage": 2}],
         "data": {"source": f"voc:{voc}", "classes": ["0", "1", "2", "3", "4"], "batch_size": 4,
                  "train_transform": {"flip": True, "color_jitter": 0.2}},
         "train": {"epochs": 1, "lr": 0.01, "seed": 3, "log_every": 1, "guards": "off",
                   "distributed": {"backend": "kvstore"}}, "export": {"formats": []}}
    run = run_folder(launch(tmp_path / "job", r), tmp_path / "job")
    assert len({(run / "logs" / f"worker-{k}.sha256").read_text() for k in (0, 1)}) == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # 24 images / (2 workers x 4)
    assert 0 <= rows[-1]["val_map50"] <= 1
    plan = json.loads((run / "plan.json").read_text())
    frozen = [p["name"] for p in plan["params"] if p["aux"] or p["grad_req"] == "null"]
    assert any(p["aux"] for p in plan["params"]) and any(not p["aux"] for p in plan["params"] if p["name"] in frozen)
    # one process, BatchNorm frozen by a rule, one step: what never trains has the same bits
    one = {**r, "rules": [*r["rules"], {"type": ["BatchNorm"], "bn": "frozen"}],
           "train": {**r["train"], "distributed": {"backend": "none"}}}
    ref = finetune(parse_recipe(one), runs_root=tmp_path / "ref", quiet=True, stop_after_steps=1)
    got, want = helpers.checkpoint_params(run), helpers.checkpoint_params(ref.run_dir)
    for name in frozen:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    trained = [p["name"] for p in plan["params"] if p["name"] not in frozen]
    assert any(not np.array_equal(got[n], want[n]) for n in trained)


def test_failing_workers_end_the_job_at_once_and_say_why_in_their_logs(tiny_bn, tmp_path):
    """A worker that fails exits instead of waiting in MXNet's kvstore teardown for its peers."""
    r = recipe(tiny_bn, distributed={"backend": "kvstore"}, lr=1e30, max_bad_steps=0)
    proc = launch(tmp_path / "nan", r)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = (tmp_path / "nan" / "runs").iterdir()
    for rank in (0, 1):  # every worker saw the same global loss and stopped at the same step
        assert "Loss was NaN/Inf in 1 steps" in (run / "logs" / f"worker-{rank}.log").read_text()
    # rank 0 alone refuses (its run folder cannot be made) while rank 1 waits for the folder's name
    (tmp_path / "file").write_text("not a folder")
    proc = launch(tmp_path / "refused", recipe(tiny_bn, distributed={"backend": "kvstore"}),
                  "--runs", str(tmp_path / "file"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Cannot create a run folder" in out and "SIGABRT" not in out, out[-3000:]


def test_early_stopping_stops_both_workers_at_the_same_step(tiny_bn, tmp_path):
    """val_top1 > -1 always: the rule stops after epoch 1 of 3; every worker agrees and stops there."""
    r = recipe(tiny_bn, distributed={"backend": "kvstore"}, epochs=3,
               callbacks=[{"early_stopping": {"monitor": "val_top1", "stopping_threshold": -1.0}}])
    run = run_folder(launch(tmp_path, r), tmp_path)
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in rows if "epoch" in x] == [1]
    steps = [x["step"] for x in rows if "loss" in x]
    assert steps == list(range(1, 10))  # 9 steps of epoch 1, none after
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["epoch"] == 1 and "stopping_threshold" in summary["stopped"]["reason"]
    assert len({(run / "logs" / f"worker-{r}.sha256").read_text() for r in (0, 1)}) == 1  # same weights, same step
