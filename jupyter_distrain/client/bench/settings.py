"""What a bench measures (:class:`BenchSettings`) and the cell each run executes: the
settings as constants, then ``programs/model.py``, then the backend's program."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ...contract.spec import SpecError

BACKENDS = ("horovod", "tf", "ps", "ps-sync", "torch", "jax")
DEFAULT_BACKENDS = ("horovod", "tf", "ps", "ps-sync")  # torch, jax: asked for (optional extras)
PS_BACKENDS = ("ps", "ps-sync")  # run with each --ps count
_PROGRAM_FILES = {
    "horovod": "horovod.py",
    "tf": "tf.py",
    "ps": "ps.py",
    "ps-sync": "ps_sync.py",
    "torch": "torch.py",
    "jax": "jax.py",
}
FRAMEWORKS = {"torch": "PyTorch", "jax": "JAX"}  # the others: TensorFlow (jax: Keras 3)
_MODEL_FILES = {"torch": "model_torch.py", "jax": "model_keras3.py"}  # the same ResNet


def framework_of(backend: str) -> str:
    """The framework a bench backend trains with, as the table names it."""
    return FRAMEWORKS.get(backend, "TensorFlow")


def program_text(name: str) -> str:
    """The text of ``programs/<name>`` (package data)."""
    return (resources.files(__package__) / "programs" / name).read_text()


@dataclass
class BenchSettings:
    """What to measure: worker counts 1..``workers``, the backends, the ps counts, the
    model and the launcher."""

    workers: int = 2
    backends: list[str] = field(default_factory=lambda: list(DEFAULT_BACKENDS))
    ps: list[int] = field(default_factory=lambda: [1])
    image_size: int = 32
    width: int = 16
    blocks: int = 2
    batch_size: int = 32
    steps: int = 20
    epochs: int = 3
    launcher: str = "local"
    launcher_options: dict[str, Any] = field(default_factory=dict)  # hosts=, ray_address=...
    timeout: float = 600.0

    def validate(self) -> BenchSettings:
        """Raise :class:`SpecError` naming the first bad setting."""
        if self.workers < 1:
            raise SpecError(f"--workers must be >= 1, got {self.workers}")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise SpecError(
                f"--backends: {', '.join(unknown) or 'none given'}; choose from "
                f"{', '.join(BACKENDS)}"
            )
        if set(PS_BACKENDS) & set(self.backends) and (not self.ps or min(self.ps) < 1):
            raise SpecError(f"--ps needs counts >= 1, got {self.ps}")
        for name in ("image_size", "width", "blocks", "batch_size", "steps"):
            if getattr(self, name) < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be >= 1")
        if self.epochs < 2:
            raise SpecError("--epochs must be >= 2 (the first one warms up)")
        return self

    def program(self, backend: str) -> str:
        """The cell a run of ``backend`` executes."""
        constants = (
            f"IMAGE, WIDTH, BLOCKS = {self.image_size}, {self.width}, {self.blocks}\n"
            f"BATCH, STEPS, EPOCHS = {self.batch_size}, {self.steps}, {self.epochs}\n"
        )
        model = program_text(_MODEL_FILES.get(backend, "model.py"))
        return constants + model + program_text(_PROGRAM_FILES[backend])

    def runs(self) -> list[tuple[str, int, int]]:
        """(backend, workers, ps) for every run, one worker count at a time."""
        runs = []
        for n in range(1, self.workers + 1):
            for backend in self.backends:
                for ps in self.ps if backend in PS_BACKENDS else [0]:
                    runs.append((backend, n, ps))
        return runs
