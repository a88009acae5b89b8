"""Which backend a job runs on: the one asked for, checked as available here, or for
``--backend auto`` the one the cell's imports and Keras's backend point at, else the first
available of :data:`BACKEND_PREFERENCE`; with the reason the cell prints."""

from __future__ import annotations

from ..contract.cellcheck import imported_packages, keras_backend_set
from ..contract.spec import JobSpec, SpecError
from ..plugins import BACKENDS, load_plugin

# --backend auto without --ps: the first of these that can run here
BACKEND_PREFERENCE = ("horovod", "tf")
TENSORFLOW_PACKAGES = {"tensorflow", "horovod", "keras", "tf_keras"}
# --backend auto: a cell importing the package, and none of the others, runs on the backend
BACKEND_OF_IMPORT = (
    ("torch", "torch", TENSORFLOW_PACKAGES | {"jax"}),
    ("jax", "jax", TENSORFLOW_PACKAGES | {"torch"}),
    ("mpi4py", "mpi", TENSORFLOW_PACKAGES | {"torch", "jax"}),
)
# those backends run no TensorFlow: their jobs need no tf.keras choice
NOT_TENSORFLOW = {backend for _, backend, _ in BACKEND_OF_IMPORT}


def resolve_backend(spec: JobSpec) -> tuple[str, str]:
    """The backend ``auto`` stands for and why; any other name is checked as given."""
    if spec.backend != "auto":
        try:
            cls = load_plugin(BACKENDS, spec.backend)
        except ValueError as exc:
            raise SpecError(f"--backend: {exc}") from None
        ok, why = cls.available()
        if not ok:
            raise SpecError(f"--backend {spec.backend}: {why}")
        return spec.backend, "as asked"
    if spec.ps:
        return "ps", "--ps given"
    imported = imported_packages(spec.code)
    keras_on_jax = spec.env.get("KERAS_BACKEND", keras_backend_set(spec.code)) == "jax"
    if keras_on_jax:
        imported = (imported - {"keras"}) | {"jax"}  # Keras 3 on JAX is a JAX program
    for package, backend, others in BACKEND_OF_IMPORT:
        if package in imported and not imported & others:
            ok, why = load_plugin(BACKENDS, backend).available()
            on_jax = keras_on_jax and package == "jax"
            does = "runs Keras on JAX" if on_jax else f"imports {package}"
            if not ok:
                raise SpecError(f"--backend auto: the cell {does}, but {why}")
            return backend, f"the cell {does} and not TensorFlow; {why}"
    reasons = []
    for name in BACKEND_PREFERENCE:
        ok, why = load_plugin(BACKENDS, name).available()
        if ok:
            return name, "; ".join([*reasons, why])
        reasons.append(why)
    raise SpecError(f"--backend auto: no backend can run here ({'; '.join(reasons)})")
