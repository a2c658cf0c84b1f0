"""train.distributed in recipes, what a worker refuses, the watchdog, and the private MXNet API
the parameter-server backend relies on."""
import subprocess
import sys

import mxnet as mx
import pytest

from tests import helpers
from gluontl.dist.backend import WATCHDOG_EXIT
from gluontl.errors import RecipeError, TrainError
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune

BASE = {"name": "x", "model": {"source": "zoo:resnet18_v1"}, "data": {"source": "demo:digits"},
        "train": {"epochs": 3, "lr": 0.1}}


def _recipe(distributed=None, rules=()):
    train = {**BASE["train"], **({"distributed": distributed} if distributed is not None else {})}
    return parse_recipe({**BASE, "rules": list(rules), "train": train})


@pytest.mark.parametrize("bad, says", [
    ({"backend": "kvstore", "kvstore": "dist_async"}, "lr_mult/wd_mult"),
    ({"backend": "kvstore", "compression": {"type": "2bit"}}, "Compression not supported with PushPull"),
    ({"backend": "mpi"}, "backend"),
    ({"backend": "kvstore", "step_timeout": 0}, "step_timeout"),
])
def test_refused_settings_say_why(bad, says):
    with pytest.raises(RecipeError, match="train.distributed") as e:
        _recipe(bad)
    assert says in str(e.value)


def test_horovod_with_several_contexts_per_worker_is_refused():
    """Horovod 0.28's Trainer reduces only the first context's gradients."""
    assert parse_recipe({**BASE, "train": {**BASE["train"], "ctx": "cpu:0,1"}})
    with pytest.raises(RecipeError, match="one Horovod process per device"):
        parse_recipe({**BASE, "train": {**BASE["train"], "ctx": "cpu:0,1", "distributed": {"backend": "horovod"}}})


def test_gradual_unfreezing_is_refused_when_distributed():
    rules = [{"match": ["*"], "grad_req": "null"}, {"stage": ["head"], "grad_req": "write", "from_epoch": 2}]
    assert _recipe(rules=rules)  # fine in one process
    with pytest.raises(RecipeError, match="rules 2 start at a later epoch"):
        _recipe({"backend": "kvstore"}, rules)


def test_digest_of_an_undistributed_recipe_is_what_it_was_before_the_field_existed():
    # computed by gluontl at 772e624, before train.distributed: old runs still resume
    assert _recipe().digest("model", "surgery", "rules", "data", "train") == "14df97be8fa0a055"
    assert _recipe({"backend": "none", "batch_norm": "rank0"}).digest("train") == _recipe().digest("train")
    kv = _recipe({"backend": "kvstore"})
    assert kv.digest("train") != _recipe().digest("train")
    assert _recipe({"backend": "kvstore", "step_timeout": 9}).digest("train") == kv.digest("train")  # a watch
    assert _recipe({"backend": "kvstore", "batch_norm": "rank0"}).digest("train") != kv.digest("train")


def test_unset_backend_is_kvstore_in_a_launched_worker(monkeypatch):
    """The documented recipes leave train.distributed out: under gluontl launch they train with the
    parameter server, alone they stay one process, and their digest is an undistributed one."""
    from gluontl.recipe import resolve_backend

    monkeypatch.delenv("DMLC_ROLE", raising=False)
    unset = _recipe()
    assert unset.train.distributed.backend is None
    assert unset.digest("model", "surgery", "rules", "data", "train") == "14df97be8fa0a055"
    alone = resolve_backend(unset)
    assert alone.train.distributed.backend == "none" and alone.digest("train") == unset.digest("train")
    monkeypatch.setenv("DMLC_ROLE", "worker")
    launched = resolve_backend(unset)
    assert launched.train.distributed.backend == "kvstore"
    assert launched.digest("train") == _recipe({"backend": "kvstore"}).digest("train")
    for explicit in ("none", "horovod"):  # a recipe that says so is never overruled
        assert resolve_backend(_recipe({"backend": explicit})).train.distributed.backend == explicit
    staged = _recipe(rules=[{"match": ["*"], "grad_req": "null"},
                            {"stage": ["head"], "grad_req": "write", "from_epoch": 2}])
    with pytest.raises(RecipeError, match="unset: kvstore in a launched worker.*rules 2 start at a later epoch"):
        resolve_backend(staged)


def _tiny(tmp_path, **distributed):
    return parse_recipe(helpers.tiny_recipe(helpers.tiny_symbol(tmp_path),
                                            **({"distributed": distributed} if distributed else {})))


@pytest.mark.parametrize("backend, unset, says", [
    ("kvstore", ("DMLC_ROLE", "DMLC_PS_ROOT_URI"), "gluontl launch -n N -- finetune"),
    ("horovod", ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"), "horovodrun -np N"),
])
def test_a_backend_outside_its_job_says_how_to_start_one(monkeypatch, tmp_path, backend, unset, says):
    for var in unset:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(TrainError, match=says):
        finetune(_tiny(tmp_path, backend=backend), runs_root=tmp_path / "runs", quiet=True)
    assert not (tmp_path / "runs").exists()


def test_horovod_backend_without_horovod_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    try:
        import horovod.mxnet  # noqa: F401
        pytest.skip("horovod.mxnet imports here (scripts/build_horovod.sh ran); "
                    "tests/dist/test_dist_train.py's Horovod test uses it")
    except ImportError:
        pass
    with pytest.raises(TrainError, match="scripts/build_horovod.sh"):
        finetune(_tiny(tmp_path, backend="horovod"), runs_root=tmp_path / "runs", quiet=True)


def test_watchdog_ends_a_worker_stuck_in_a_collective():
    """The main thread blocks the way a worker blocks on a dead peer (in a wait it never returns
    from); the watchdog must end the process with its own code and say why."""
    code = ("import threading\n"
            "from gluontl.dist.backend import Watchdog\n"
            "dog = Watchdog(0.5, 1, print)\n"
            "with dog('a training step'):\n"
            "    threading.Event().wait()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == WATCHDOG_EXIT
    assert "rank 1: a training step did not finish within train.distributed.step_timeout=0.5s" in p.stdout


def test_watchdog_leaves_finished_sections_alone():
    code = ("import threading\n"
            "from gluontl.dist.backend import Watchdog\n"
            "dog = Watchdog(0.3, 0, print)\n"
            "for _ in range(3):\n"
            "    with dog('a step'):\n"
            "        pass\n"
            "threading.Event().wait(1.0)\n"  # disarmed: nothing fires while the process idles
            "print('alive')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "alive"


def test_the_private_trainer_api_the_first_step_broadcast_uses_is_there():
    """KVStoreBackend.prepare calls these MXNet 1.9.1 internals (the version setup.cfg pins)."""
    assert mx.__version__ == "1.9.1"
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    t = mx.gluon.Trainer([p], "sgd", {"learning_rate": 0.1})
    assert callable(t._init_kvstore) and callable(t._init_params)
    assert t._kv_initialized is False and t._params_to_init == [p] and t._params == [p]
    t._init_kvstore()
    t._init_params()
    assert t._kv_initialized is True and t._params_to_init == []


@pytest.mark.parametrize("var, value, engine, backend", [("DMLC_ROLE", "worker", "kvstore", {"backend": "none"}),
                                                       ("HOROVOD_RANK", "1", "horovod", {"backend": "none"}),
                                                       ("HOROVOD_RANK", "1", "horovod", {})])  # unset
def test_a_job_s_worker_with_an_undistributed_recipe_is_refused(monkeypatch, tmp_path, var, value, engine, backend):
    """It would train alone and race the other workers for the run folder. (Unset under gluontl
    launch means kvstore: test_unset_backend_is_kvstore_in_a_launched_worker.)"""
    monkeypatch.setenv(var, value)
    with pytest.raises(TrainError, match=f"--set train.distributed.backend={engine}"):
        finetune(_tiny(tmp_path, **backend), runs_root=tmp_path / "runs", quiet=True)
    assert not (tmp_path / "runs").exists()


def test_plan_shows_what_a_job_s_workers_train(capsys, tmp_path):
    """`gluontl plan` on a distributed recipe shows the BatchNorm statistics frozen, and by what."""
    import json

    import yaml

    r = {"name": "p", "model": {"source": "zoo:mobilenet0.25", "input_shape": [3, 32, 32]},
         "rules": [{"match": ["output.*"], "lr_mult": 2.0}], "train": {"distributed": {"backend": "kvstore"}}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    code, out, _ = helpers.run_cli(capsys, "plan", "--recipe", str(path), "--json")
    assert code == 0
    bn = [p for p in json.loads(out)["params"] if p["layer_type"] == "BatchNorm"]
    assert bn and all(p["bn"] == "frozen" and p["decided_by"]["bn"] == "train.distributed.batch_norm" for p in bn)
    path.write_text(yaml.safe_dump({**r, "train": {"distributed": {"backend": "kvstore", "batch_norm": "rank0"}}}))
    code, out, _ = helpers.run_cli(capsys, "plan", "--recipe", str(path), "--json")
    assert {p["bn"] for p in json.loads(out)["params"] if p["layer_type"] == "BatchNorm"} == {"train"}
