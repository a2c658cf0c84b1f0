#!/usr/bin/env python
"""Mutation testing (mutmut 3) of the modules that carry gluontl's promises; prints kill rates.

    scripts/mutation.py                 # every module, one after the other
    scripts/mutation.py rules restore   # some of them
    scripts/mutation.py --survivors checkpoint   # re-test only last run's survivors (after adding tests)
    scripts/mutation.py --fresh verify  # forget cached results and mutants of that module
    scripts/mutation.py --report        # kill rates of the last runs, nothing run
    scripts/mutation.py --show rules    # the diffs of the last run's survivors

Each module runs in its own work folder ``mutants/<module>/`` (git-ignored) holding symlinks to
gluontl/ and tests/ and a generated setup.cfg: its ``[mutmut]`` section names the one file to
mutate and the few test files that exercise it, so a mutant costs seconds, and the repo's own
setup.cfg/pyproject.toml stay untouched (scripts/env.sh rebuilds the venv when they change).
mutmut copies both into ``mutants/<module>/mutants/`` and runs pytest there; ``mutmut show NAME``
or ``mutmut browse`` run inside ``mutants/<module>/`` inspect a mutant.

Subprocess tests (CLI, kill -9) are left out of the selections: a child process imports the
unmutated package, so they could never kill a mutant. Equivalent mutants and the kill rates are
in docs/mutation.md.
"""
from __future__ import annotations

import argparse
import configparser
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module -> (file to mutate, pytest arguments selecting the tests that exercise it; fast ones only)
MODULES: dict[str, tuple[str, list[str]]] = {
    "rules": ("gluontl/rules.py", ["tests/test_rules.py", "tests/test_rules_graph_bn.py", "tests/test_rules_kinds.py",
                                   "--deselect",  # a whole finetune run (~15 s) that the expansion test covers
                                   "tests/test_rules_kinds.py::test_fine_tune_run_trains_the_head_then_everything"]),
    "restore": ("gluontl/sources/restore.py", ["tests/sources/test_sources.py"]),
    "checkpoint": ("gluontl/data/checkpoint.py", [
        "tests/data/test_checkpoint.py",  # less its CLI subprocess (it cannot see a mutant)
        "--deselect", "tests/data/test_checkpoint.py::test_a_poisoned_run_folder_runs_nothing_on_resume"]),
    # the checkpoint read-back (hash and file-name checks) that left checkpoint.py (issue 20)
    "runfolder": ("gluontl/runfolder.py", [
        "tests/data/test_checkpoint.py", "tests/test_runfolder.py",
        "--deselect", "tests/data/test_checkpoint.py::test_a_poisoned_run_folder_runs_nothing_on_resume"]),
    "verify": ("gluontl/export/verify.py", [
        "tests/export/test_export.py",  # less two 25 s exports that test the lean rewrite, not verification
        "--deselect", "tests/export/test_export.py::test_raw_keeps_weight_inputs_and_batchnorm_and_agrees_with_lean",
        "--deselect", "tests/export/test_export.py::test_frozen_batchnorm_exports_same_graph",
        # a patched real graph whose output is a saturated sigmoid map (PP-OCR's detector)
        "tests/export/test_export_patch.py::test_real_model_trains_on_every_weight_and_exports_its_own_graph"
        "[ch_PP-OCRv4_det_infer]"]),
    "torch_legacy": ("gluontl/convert/torch_legacy.py", ["tests/convert/test_convert_torch_legacy.py"]),
    # less the zoo models (the recipe's finetune run, ResNet-18 and MobileNet: seconds each per mutant);
    # the tiny Gluon model's tests check the same promises in milliseconds
    "adapters": ("gluontl/adapters.py", [
        "tests/test_adapters.py",
        "--deselect", "tests/test_adapters.py::test_resnet18_freeze_recipe_with_lora_trains_and_exports_plain_onnx",
        "--deselect", "tests/test_adapters.py::test_zoo_model_equals_base_at_init_trains_only_adapters_and_merges",
        "--deselect", "tests/test_adapters.py::test_lora_trains_under_a_tenth_of_the_layers_parameters",
        "--deselect", "tests/test_adapters.py::test_cli_plan_names_the_depthwise_convolutions_an_adapter_leaves_out"]),
    "detect_metrics": ("gluontl/detect/metrics.py", ["tests/detect/test_detect_metrics.py",
                                                      "tests/detect/test_detect_iou.py"]),
    "sampler": ("gluontl/data/sampler.py", [
        "tests/dist/test_shard.py",
        "tests/data/test_data.py::test_same_seed_same_batches_other_seed_other_batches",
        "tests/data/test_data.py::test_skip_resumes_with_the_tail_of_the_epoch",
        "tests/data/test_data.py::test_epoch_sampler_keep_and_discard"]),
    # the by-hand and threshold tests (the finetune runs of test_guards.py take minutes each)
    "guards": ("gluontl/data/guards.py", [
        "tests/data/test_guards.py", "-k", "by_hand or just or quarter or ten_steps or spread or nudge or "
        "frozen_backbone_is or guard_levels or statistics_loaded or later_rule or left_out or two_to_eight or "
        "zoo_backbone or dead_frozen or nan_weights or words or few_names or resumed_run_keeps or inclusive or "
        "frozen_throughout or not_compared or weights_line or rule_lists"]),
    # less the two ResNet-18 runs (~85 s and ~20 s) whose BatchNorm handling the unit tests check
    "ema": ("gluontl/train/ema.py", [
        "tests/train/test_ema.py",
        "--deselect", "tests/train/test_ema.py::test_with_the_feature_cache_and_recomputed_batchnorm_the_model_"
                      "trains_as_without_ema",
        "--deselect", "tests/train/test_ema.py::test_copied_batchnorm_statistics_are_the_models"]),
    "lrfind": ("gluontl/train/lrfind.py", ["tests/train/test_lrfind.py"]),
}

# mutmut exit codes (mutmut.stats.status_by_exit_code) a mutant can end with
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = (0, 5, 33)  # survived; no tests (pytest's exit 5, mutmut's 33)


def _statuses(meta: Path) -> Counter:
    from mutmut.stats import status_by_exit_code

    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return Counter(status_by_exit_code[c] for c in codes.values())


def _survivors(meta: Path) -> list[str]:
    """Mutants that survived or that no selected test reached (tests added since may reach them)."""
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(k for k, c in codes.items() if c in UNDETECTED)


def _prepare(name: str, fresh: bool) -> Path:
    target, tests = MODULES[name]
    work = ROOT / "mutants" / name
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for link in ("gluontl", "tests"):
        if not (work / link).is_symlink():
            (work / link).symlink_to(ROOT / link, target_is_directory=True)
    repo_cfg = configparser.ConfigParser(interpolation=None)
    repo_cfg.read(ROOT / "setup.cfg")
    cfg = configparser.ConfigParser(interpolation=None)
    cfg["tool:pytest"] = dict(repo_cfg["tool:pytest"])  # the suite's own pytest options
    cfg["mutmut"] = {
        "source_paths": "gluontl",
        "only_mutate": target,
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(tests),
        "pytest_add_cli_args": "\n-p\nno:cacheprovider",
    }
    with open(work / "setup.cfg", "w") as fh:
        cfg.write(fh)
    return work


def _meta(name: str) -> Path:
    return ROOT / "mutants" / name / "mutants" / (MODULES[name][0] + ".meta")


def run(name: str, *, fresh: bool, survivors: bool, max_children: int) -> None:
    names: list[str] = []
    if survivors:
        if not _meta(name).is_file():
            sys.exit(f"{name}: no previous run to take survivors from; run without --survivors first")
        names = _survivors(_meta(name))
        if not names:
            print(f"{name}: no survivors to re-test")
            return
    work = _prepare(name, fresh)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # a source tree on it shadows mutmut's mutated copy: every mutant would survive
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    print(f"== {name}: mutating {MODULES[name][0]} with {' '.join(MODULES[name][1])}", flush=True)
    subprocess.run(cmd, cwd=work, env=env, check=True)


def show(name: str) -> None:
    work = ROOT / "mutants" / name
    codes = json.loads(_meta(name).read_text())["exit_code_by_key"] if _meta(name).is_file() else {}
    for m, code in sorted(codes.items()):
        if code in UNDETECTED:
            subprocess.run([sys.executable, "-m", "mutmut", "show", m], cwd=work, check=True)


def report(names: list[str]) -> int:
    worst = 100.0
    for name in names:
        meta = _meta(name)
        if not meta.is_file():
            print(f"{name:<11} not run yet")
            continue
        s = _statuses(meta)
        total = sum(s.values())
        killed = sum(v for k, v in s.items() if k in DETECTED)
        rate = 100.0 * killed / total if total else 100.0
        worst = min(worst, rate)
        other = ", ".join(f"{k} {v}" for k, v in sorted(s.items()) if k not in DETECTED)
        print(f"{name:<11} {MODULES[name][0]:<28} killed {killed}/{total} = {rate:.1f} %  ({other or 'none left'})")
        for m in _survivors(meta):
            print(f"    not killed: {m}")
    return 0 if worst >= 90.0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"any of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--fresh", action="store_true", help="delete the module's work folder first")
    ap.add_argument("--survivors", action="store_true", help="re-test only the last run's survivors")
    ap.add_argument("--report", action="store_true", help="print the last runs' kill rates only")
    ap.add_argument("--show", action="store_true", help="print the diffs of the last runs' survivors")
    ap.add_argument("--max-children", type=int, default=1,
                    help="parallel mutants (default 1: the machine is shared)")
    args = ap.parse_args()
    names = args.modules or list(MODULES)
    if unknown := [n for n in names if n not in MODULES]:
        ap.error(f"unknown module(s) {unknown}; choose from {', '.join(MODULES)}")
    if args.show:
        for name in names:
            show(name)
        return 0
    if not args.report:
        for name in names:  # one module at a time
            run(name, fresh=args.fresh, survivors=args.survivors, max_children=args.max_children)
    print()
    return report(names)


if __name__ == "__main__":
    sys.exit(main())
