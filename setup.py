"""Everything is in setup.cfg; this file only ships ``gluontl-npcompat.pth`` (see _gluontl_hook.py).

A ``.pth`` file must land in site-packages itself, which setup.cfg cannot express: regular wheels
get it from build_py's output, editable wheels (pip install -e) from a wrapper of the editable strategy, as setuptools'
editable_wheel leaves build_py's output out of them.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "gluontl-npcompat.pth"
HERE = Path(__file__).resolve().parent


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(str(HERE / PTH), str(Path(self.build_lib) / PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


class EditableWheelWithPth(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _AlsoWritePth(super()._select_strategy(*args, **kwargs))


class _AlsoWritePth:
    """The editable strategy (which writes setuptools' own finder .pth), then ours into the same wheel."""

    def __init__(self, strategy):
        self.strategy = strategy

    def __call__(self, wheel, files, mapping):
        self.strategy(wheel, files, mapping)
        wheel.writestr(PTH, (HERE / PTH).read_bytes())

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self.strategy.__exit__(*exc)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
