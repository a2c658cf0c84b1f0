"""Run at interpreter start-up by ``gluontl-npcompat.pth`` (installed with gluontl), so that the
first ``import mxnet`` or ``import gluoncv`` imports ``gluontl.npcompat`` before them whatever a
script imports first: mxnet 1.9.1 and GluonCV 0.10.5 read numpy names that numpy 1.24 and 2.0
removed. Lazy: nothing (not even numpy) is imported until one of them is, and npcompat defines only
what numpy lacks, so on numpy 1.23 the hook changes nothing. Top-level, beside the ``gluontl``
package, because importing anything inside that package imports numpy.
"""
import sys

TRIGGERS = ("mxnet", "gluoncv")


class NpcompatFirst:
    """A meta-path finder that finds nothing: it only imports npcompat on the first trigger."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in TRIGGERS:
            uninstall()
            try:
                import gluontl.npcompat  # noqa: F401
            except ImportError:  # gluontl gone but this hook left behind: never break the user's import
                pass
        return None


def install() -> None:
    if "gluontl.npcompat" not in sys.modules and NpcompatFirst not in sys.meta_path:
        sys.meta_path.insert(0, NpcompatFirst)


def uninstall() -> None:
    while NpcompatFirst in sys.meta_path:
        sys.meta_path.remove(NpcompatFirst)
