# One-command setup for a fresh Debian machine (run as root, or with sudo available).
#   make demo   set everything up, then run notebooks/01-quickstart.ipynb headless
#   make test   set everything up, then run the test suite
# Both are idempotent: each step is skipped when its stamp file is newer than its inputs.

# Debian's own python3 where there is one: a virtualenv keeps a link to the interpreter it
# was made from, and one under /root (pyenv's) is not runnable by the ordinary accounts the
# user-facing tests run as (nor by the users of a shared install)
PYTHON ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
VENV   ?= .venv
# TF=pinned: TensorFlow 2.15.1 + Horovod built from source (Python <= 3.11);
# TF=current: TensorFlow 2.20 + tf-keras, no Horovod (Horovod does not build against it).
# auto: pinned where TensorFlow 2.15.1 installs (Python <= 3.11), else current.
TF     ?= auto
CURRENT_VENV ?= .venv-current
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMPS := $(VENV)/.stamps
comma  := ,
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

HOROVOD_VERSION := 0.28.1
ifeq ($(TF),auto)
  override TF := $(shell $(PYTHON) -c 'import sys; print("pinned" if sys.version_info[:2] <= (3, 11) else "current")' 2>/dev/null || echo pinned)
endif
TF_PACKAGES.pinned  := tensorflow-cpu==2.15.1
TF_PACKAGES.current := tensorflow-cpu==2.20.0 tf-keras==2.20.1
HOROVOD.pinned      := $(STAMPS)/horovod
HOROVOD_WHEEL.pinned := $(STAMPS)/horovod-wheel
# PyTorch for --backend torch (CPU). On these machines pip takes torch 2.13.0's CPU wheel
# from the local wheel directory; elsewhere PyPI's default is a CUDA build of several GB:
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU one there.
# WITH_TORCH=0 leaves it out (the second run, on current TensorFlow, runs no torch test).
TORCH_PACKAGES ?= torch==2.13.0
TORCH_INDEX    ?=
WITH_TORCH     ?= 1
TORCH.1        := $(STAMPS)/torch
# JAX for --backend jax (CPU wheels from PyPI), with Keras 3: only beside current TensorFlow
# (it needs NumPy 2; TensorFlow 2.15 needs NumPy 1), so its tests run in the second run
WITH_JAX       ?= $(if $(filter current,$(TF)),1,0)
JAX_EXTRA.1    := $(comma)jax
# the bench of tf and ps runs in the second run; here the bench notebook's test has those rows
MARKS.pinned  := not jax
MARKS.current := not horovod
PYTEST_ARGS.pinned  := \
  --deselect tests/test_bench.py::test_a_two_worker_bench_of_tf_and_ps_measures_every_configuration
PYTEST_ARGS.current :=
# the second run (current TensorFlow beside the pinned one) runs JAX's tests and the tests
# whose outcome depends on TensorFlow's version: its backends, Keras's hooks and output,
# AutoGraph's files, the seed's programs, the quickstart notebook (`make demo`; the ps and
# seed-flow notebooks' programs are test_tf_backends' and test_workers_api's) and the bench
# that train with it, the port scan of its servers, and one warm pool of it (pooling
# itself, the channels, the launchers, the server, torch and the rest run once, in the
# first run)
SECOND_RUN_ARGS := tests/test_jax.py tests/test_ssh.py::test_a_jax_job_runs_one_process_on_each_host \
  tests/test_tf_backends.py tests/test_metrics_widget.py \
  tests/test_worker_tmp.py tests/test_cell_output.py tests/test_workers_api.py \
  tests/test_notebook.py::test_quickstart_notebook_trains_digits_to_90_percent tests/test_bench.py \
  --deselect tests/test_bench.py::test_synchronous_parameter_servers_are_benched_with_the_seeds_program \
  tests/faults/test_faults.py::test_a_port_scan_from_another_host_finds_nothing_of_a_ps_job_then_kill_the_ps \
  tests/test_pool.py::test_a_rerun_takes_pooled_processes_that_behave_like_fresh_workers \
  tests/test_pool.py::test_a_kind_whose_imports_leave_a_thread_running_is_not_pooled

# apt-get install $(1), the packages' own service starts held back while they install (a
# temporary /usr/sbin/policy-rc.d, removed after, where none was there)
held_install = held=; \
	  [ -e /usr/sbin/policy-rc.d ] || { printf '\#!/bin/sh\nexit 101\n' | $(SUDO) tee /usr/sbin/policy-rc.d >/dev/null \
	    && $(SUDO) chmod 755 /usr/sbin/policy-rc.d && held=1; }; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends $(1); code=$$?; \
	  [ -z "$$held" ] || $(SUDO) rm -f /usr/sbin/policy-rc.d; exit $$code

.PHONY: setup demo lab test check flake test-ui lint clean

# The package and its tools install beside Horovod's build (~5 minutes of compiling into a
# wheel); torch waits for that build (its install upgrades setuptools, which the build
# uses from the virtualenv), then the wheel is installed: a fresh setup ~2 minutes sooner
setup:
	@$(MAKE) --no-print-directory -j2 $(STAMPS)/ready

$(STAMPS)/ready: $(STAMPS)/package $(HOROVOD.$(TF)) $(TORCH.$(WITH_TORCH))
	@touch $@

$(STAMPS)/system:
	@# iproute2: the fault tests make a second "host" (a network namespace) to port-scan from;
	@# acl, python3-seccomp: the test accounts (tests/users/), and a container's refusal of
	@# namespaces (tests/users/no_namespaces.py)
	@dpkg -s libopenmpi-dev openmpi-bin cmake g++ openssh-client iproute2 acl python3-seccomp >/dev/null 2>&1 \
	  || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	        --no-install-recommends libopenmpi-dev openmpi-bin cmake g++ make procps openssh-client \
	        iproute2 acl python3-seccomp; }
	@# openssh-server: the multi-host tests run Debian's sshd inside network namespaces; never
	@# as a service here (the package's own start is held back while it installs)
	@[ -x /usr/sbin/sshd ] || { $(call held_install,openssh-server); }
	@# Slurm (slurmctld, slurmd, their clients) and munge: the Slurm launcher's tests start
	@# their own munged, slurmctld and slurmd "nodes" (tests/slurmcluster.py); never services
	@[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] \
	  || { $(call held_install,slurm-wlm slurmctld slurmd slurm-client munge); }
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	@# Debian's own python3 needs its venv and headers packages (Horovod compiles against them)
	@$(PYTHON) -c 'import ensurepip, sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null \
	  || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	        --no-install-recommends python3-venv python3-dev; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" "setuptools<70" wheel packaging
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/tensorflow-$(TF): $(STAMPS)/system
	$(PIP) install -q $(TF_PACKAGES.$(TF))
	@touch $@

# Horovod 0.28.1 ships only as an sdist: built here into a wheel against the TensorFlow
# above with MPI and Gloo (~5 min). pip keeps the built wheel in its cache, so a rebuild is
# instant. The system cmake is used on purpose: PyPI's cmake 4.x rejects Gloo's old CMakeLists.
WHEELS := $(VENV)/wheels
# (MAKEFLAGS: this make's own, with its job server, would make Horovod's build one job
# at a time: it compiles on every core)
$(STAMPS)/horovod-wheel: $(STAMPS)/tensorflow-pinned
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$$(nproc) \
	  $(PIP) wheel -q --no-deps --no-build-isolation -w $(WHEELS) "horovod==$(HOROVOD_VERSION)"
	@touch $@

$(STAMPS)/horovod: $(STAMPS)/horovod-wheel $(STAMPS)/package $(TORCH.$(WITH_TORCH))
	$(PIP) install -q $(WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl
	$(PY) -c 'import horovod.tensorflow as hvd; assert hvd.gloo_built() and hvd.mpi_built(), "horovod built without gloo or mpi"'
	@touch $@

$(STAMPS)/torch: $(STAMPS)/package $(HOROVOD_WHEEL.$(TF))
	$(PIP) install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PACKAGES)
	$(PY) -c 'import torch.distributed as dist; assert dist.is_gloo_available(), "torch without Gloo"'
	@touch $@

$(STAMPS)/package: $(STAMPS)/tensorflow-$(TF) pyproject.toml
	@# a built extension holds a copy of install.json, which pyproject.toml also adds:
	@# hatchling refuses the second (a re-install after a pyproject.toml change failed)
	rm -f jupyter_distrain/labextension/install.json
	$(PIP) install -q -e ".[dev$(JAX_EXTRA.$(WITH_JAX))]"
	@touch $@

# the executed copy goes to build/demo (ignored): the tracked *.executed.ipynb change only
# when written on purpose (notebooks/run.py without --out)
demo: setup
	mkdir -p build/demo
	$(PY) notebooks/run.py notebooks/01-quickstart.ipynb --out build/demo

# JupyterLab on the notebooks, with the extension built and linked (--allow-root as root)
lab: setup $(STAMPS)/labextension
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

# The user battery runs as the ordinary account $(TEST_USER) (tests/users/accounts.sh makes
# it and its neighbour); only the tests marked `root` (they make test hosts or mount) run
# as root. tests/batteries.py runs the batteries side by side, BATTERY_JOBS at a time (the
# second virtualenv's install beside them), and says each one's time and slowest tests at
# its end (their whole output in build/tests/NAME.log). USER_WORKERS=N runs the ordinary
# account's batteries in N pytest-xdist workers (a module's tests in one worker); on two
# cores that only loads the machine past what the timing of some tests allows (see
# tests/README.md). The root battery runs one test after another: its modules share the
# ssh hosts' bridge and port.
TEST_USER    := distrain-alice
USER_WORKERS ?= 0
BATTERY_JOBS ?= 2
PYTEST_RUN   := -p no:cacheprovider --durations=15
USER_PYTEST = $(SUDO) env VENV=$(1) tests/users/as_user.sh $(TEST_USER) $(1)/bin/pytest $(PYTEST_RUN) \
  $(if $(filter-out 0 1,$(USER_WORKERS)),-n $(USER_WORKERS) --dist loadfile,-p no:xdist)
ROOT_PYTEST = $(SUDO) $(1)/bin/pytest $(PYTEST_RUN) -p no:xdist
# the second run: current TensorFlow's virtualenv (installed beside the first batteries),
# then its two batteries
ifeq ($(TF),pinned)
CURRENT_BATTERIES := \
  "+current-setup=$(MAKE) --no-print-directory setup VENV=$(CURRENT_VENV) TF=current WITH_TORCH=0" \
  "current-user<current-setup=$(call USER_PYTEST,$(CURRENT_VENV)) -m '$(MARKS.current) and not root' $(SECOND_RUN_ARGS)" \
  "current-root<current-setup=$(call ROOT_PYTEST,$(CURRENT_VENV)) -m '$(MARKS.current) and root' $(SECOND_RUN_ARGS)"
endif
# the extension is built first (tests/test_wheel.py builds the package with it, as a release
# does) and the hub's proxy (tests/test_hub.py); what only the UI battery needs (the browser,
# the UI tests' packages) installs beside the first batteries, as the second virtualenv does
test: setup $(STAMPS)/hub-proxy $(STAMPS)/labextension
	$(VENV)/bin/ruff check jupyter_distrain tests benchmarks notebooks
	$(SUDO) tests/users/accounts.sh
	$(PY) tests/batteries.py --jobs $(BATTERY_JOBS) \
	  "user=$(call USER_PYTEST,$(VENV)) -m '$(MARKS.$(TF)) and not root' $(PYTEST_ARGS.$(TF))" \
	  "root=$(call ROOT_PYTEST,$(VENV)) -m '$(MARKS.$(TF)) and root' $(PYTEST_ARGS.$(TF))" \
	  $(CURRENT_BATTERIES) \
	  "+ui-setup=$(MAKE) --no-print-directory $(STAMPS)/ui-tests $(STAMPS)/chromium" \
	  "ui<ui-setup=$(MAKE) --no-print-directory test-ui"

# The timing-sensitive tests, FLAKE_ROUNDS times as the ordinary account (tests/rounds.py
# counts each one's failures): run it beside a load (a `make test`, CPU burners). In one
# xdist worker: its own runtime and cache directories (tests/conftest.py), as a second
# login of the account has, so that it never shares a pool or a standby with the load
FLAKE_ROUNDS ?= 20
flake: setup
	$(SUDO) tests/users/accounts.sh
	$(PY) tests/rounds.py $(FLAKE_ROUNDS) $(SUDO) env VENV=$(VENV) tests/users/as_user.sh \
	  $(TEST_USER) $(VENV)/bin/pytest -p no:cacheprovider -n 1 $$(grep -v '^#' tests/timing_sensitive.txt)

# The fast tier, after every edit (setup done): lint, the layers, the units that start no
# job (as $(TEST_USER) where run as root, as the user battery runs), Jest
CHECK_TESTS := tests/test_layers.py tests/test_units.py tests/test_client_rules.py \
  tests/test_supervisor_rules.py tests/test_config.py tests/test_gpus.py tests/test_hosts.py \
  tests/test_labextension.py tests/test_agent_leftovers.py tests/test_delivery.py \
  tests/test_hardening.py tests/test_retention.py tests/test_channels.py tests/test_agent_handles.py
CHECK_PYTEST = $(VENV)/bin/pytest $(PYTEST_RUN) -q -n 2 --dist loadfile -m "not root" $(CHECK_TESTS)
check: setup $(STAMPS)/labextension
	$(VENV)/bin/ruff check jupyter_distrain tests benchmarks notebooks
	$(VENV)/bin/ruff format --check jupyter_distrain tests benchmarks notebooks
ifeq ($(shell id -u),0)
	tests/users/accounts.sh
	env VENV=$(VENV) tests/users/as_user.sh $(TEST_USER) $(CHECK_PYTEST)
else
	$(CHECK_PYTEST)
endif
	cd $(LABEXT) && $(JLPM) test

# --- the JupyterLab extension (labextension/) and its tests --------------------------------
LABEXT     := labextension
UI_TESTS   := $(LABEXT)/ui-tests
LABEXT_SRC := $(LABEXT)/package.json $(LABEXT)/yarn.lock \
              $(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/* $(LABEXT)/schema/*)
# jlpm: JupyterLab's own yarn (no npm needed); the venv first on PATH for `jupyter labextension`
JLPM        = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(CURDIR)/$(VENV)/bin/jlpm
NODE_OK    := node -e 'process.exit(parseInt(process.versions.node) < 20 ? 1 : 0)'

# Node >= 20: Playwright 1.64 (the UI tests) needs it; the apt source that gives
# Node 20 (nodesource here) is kept, Debian 12's own nodejs (18) is too old for the tests
$(STAMPS)/node: $(STAMPS)/system
	@$(NODE_OK) 2>/dev/null || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	  $(SUDO) apt-get install -y -q --no-install-recommends nodejs; }
	@$(NODE_OK) || { echo "labextension/ needs Node.js >= 20, found $$(node --version)" >&2; exit 1; }
	@touch $@

# Debian's Chromium runs the UI tests (never a browser downloaded by Playwright)
$(STAMPS)/chromium: $(STAMPS)/system
	@[ -x /usr/bin/chromium ] || { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	  $(SUDO) apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core; }
	@touch $@

# `pip install -e .` builds the extension when there is no build (hatch-jupyter-builder);
# here it is rebuilt when a source changed, and the venv's copy linked to this build
# built with JupyterLab 4.6's toolchain: jupyter-builder (PyPI; its jlpm) and npm's
# @jupyter/builder (rspack), as pip's isolated build of this package is
$(STAMPS)/labextension: $(STAMPS)/package $(STAMPS)/node $(LABEXT_SRC)
	cd $(LABEXT) && $(JLPM) install && $(JLPM) build:prod
	$(VENV)/bin/jupyter-builder develop --overwrite .
	@touch $@

# JupyterHub's proxy (configurable-http-proxy) for tests/test_hub.py, from the npm registry
$(STAMPS)/hub-proxy: $(STAMPS)/node tests/hub/package.json tests/hub/package-lock.json
	cd tests/hub && npm ci --no-audit --no-fund --silent
	@touch $@

$(STAMPS)/ui-tests: $(STAMPS)/node $(UI_TESTS)/package.json $(UI_TESTS)/yarn.lock
	cd $(UI_TESTS) && $(JLPM) install
	@touch $@

# started by root, the UI tests' Jupyter server runs as $(TEST_USER) (start-server.sh)
test-ui: $(STAMPS)/labextension $(STAMPS)/ui-tests $(STAMPS)/chromium $(STAMPS)/hub-proxy
	$(if $(filter 0,$(shell id -u)),tests/users/accounts.sh)
	cd $(LABEXT) && $(JLPM) prettier:check && $(JLPM) test
	cd $(UI_TESTS) && UI_TESTS_USER=$(TEST_USER) $(JLPM) playwright test

lint: setup
	$(VENV)/bin/ruff check jupyter_distrain tests benchmarks notebooks

clean:
	rm -rf $(VENV) $(CURRENT_VENV)
	rm -rf $(LABEXT)/node_modules $(LABEXT)/lib $(UI_TESTS)/node_modules jupyter_distrain/labextension
