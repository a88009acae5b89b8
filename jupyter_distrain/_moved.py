"""Old module names kept working for one release (0.1 -> 0.2): ``jupyter_distrain.store``
is :mod:`jupyter_distrain.contract.store`, ``python -m jupyter_distrain.remote`` runs the
host agent, and so on. The old name is the new module itself (one module object), found
through a meta-path finder, so nothing is duplicated in the package's top level."""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

MOVED = {
    "api": "client.api",
    "bench": "client.bench",
    "follow": "client.follow",
    "job": "client.job",
    "launchflags": "client.flags",
    "magics": "client.magics",
    "output": "client.output",
    "widget": "client.widget",
    "workers": "client.cml",
    "cellcheck": "contract.cellcheck",
    "control": "contract.control",
    "metrics": "contract.metrics",
    "spec": "contract.spec",
    "store": "contract.store",
    "tail": "contract.tail",
    "instrument": "worker.instrument",
    "strategy": "worker.strategy",
    "remote": "launchers.agent",
    "launchers.ssh_session": "launchers.ssh.session",
    "launchers.hosts": "launchers.ssh.hosts",
    "launchers.ray_node": "launchers.ray.node",
    "launchers.ray_probe": "launchers.ray.probe",
}
# an old name a program runs with `python -m`: the module whose code `-m` runs
RUN_AS_MAIN = {"remote": "launchers.agent.__main__"}
PACKAGE = __name__.rpartition(".")[0]


class _Alias:  # an importlib.abc.Loader (not subclassed: importing that ABC costs ~20 ms)
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} is now {self.new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[self.old] = module  # the import system keeps the new module as it is

    def get_code(self, fullname: str) -> CodeType | None:
        """What ``python -m OLD`` runs: the new module's code (``runpy`` asks for it)."""
        import importlib.util

        short = self.old[len(PACKAGE) + 1 :]
        target = f"{PACKAGE}.{RUN_AS_MAIN[short]}" if short in RUN_AS_MAIN else self.new
        spec = importlib.util.find_spec(target)
        assert spec is not None and spec.loader is not None
        return spec.loader.get_code(target)  # type: ignore[attr-defined]

    def is_package(self, fullname: str) -> bool:
        return False


class MovedModuleFinder:  # an importlib.abc.MetaPathFinder
    """Finds ``jupyter_distrain.<old>`` as the module it moved to."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
        if not fullname.startswith(PACKAGE + "."):
            return None
        new = MOVED.get(fullname[len(PACKAGE) + 1 :])
        if new is None:
            return None
        return ModuleSpec(fullname, _Alias(fullname, f"{PACKAGE}.{new}"))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
