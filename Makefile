# One-command setup for a fresh Debian machine (run as root, or with sudo available).
#   make demo   set everything up, then run notebooks/01-quickstart.ipynb headless
#   make test   set everything up, then run the test suite
# Both are idempotent: each step is skipped when its stamp file is newer than its inputs.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMPS := $(VENV)/.stamps
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

TF_VERSION      := 2.15.1
HOROVOD_VERSION := 0.28.1

.PHONY: setup demo test lint clean

setup: $(STAMPS)/package

$(STAMPS)/system:
	@# iproute2: the fault tests make a second "host" (a network namespace) to port-scan from
	@dpkg -s libopenmpi-dev openmpi-bin cmake g++ openssh-client iproute2 >/dev/null 2>&1 \
	  || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	        --no-install-recommends libopenmpi-dev openmpi-bin cmake g++ make procps openssh-client \
	        iproute2; }
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	@# Debian's own python3 needs its venv and headers packages (Horovod compiles against them)
	@$(PYTHON) -c 'import ensurepip, sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null \
	  || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	        --no-install-recommends python3-venv python3-dev; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" "setuptools<70" wheel packaging
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/tensorflow: $(STAMPS)/system
	$(PIP) install -q "tensorflow-cpu==$(TF_VERSION)"
	@touch $@

# Horovod 0.28.1 ships only as an sdist: built here against the TensorFlow above with
# MPI and Gloo (~3 min). pip keeps the built wheel in its cache, so a rebuild is instant.
# The system cmake is used on purpose: PyPI's cmake 4.x rejects Gloo's old CMakeLists.
$(STAMPS)/horovod: $(STAMPS)/tensorflow
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	  $(PIP) install -q --no-build-isolation "horovod==$(HOROVOD_VERSION)"
	$(PY) -c 'import horovod.tensorflow as hvd; assert hvd.gloo_built() and hvd.mpi_built(), "horovod built without gloo or mpi"'
	@touch $@

$(STAMPS)/package: $(STAMPS)/horovod pyproject.toml
	$(PIP) install -q -e ".[dev]"
	@touch $@

demo: setup
	$(PY) notebooks/run.py notebooks/01-quickstart.ipynb

test: setup
	$(VENV)/bin/ruff check jupyter_distrain tests benchmarks notebooks
	$(VENV)/bin/pytest

lint: setup
	$(VENV)/bin/ruff check jupyter_distrain tests benchmarks notebooks

clean:
	rm -rf $(VENV)
