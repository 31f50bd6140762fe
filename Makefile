# hvdps: one-command set-up on a fresh Debian machine (Python 3.9-3.13, root or sudo).
#   make demo   set up everything, then run the side-by-side comparison on the bundled digits, and a short tune
#   make test   set up everything, then run the test suite
# Set-up is idempotent: a stamp file records a verified install, so later calls are fast.

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
# TF picks the TensorFlow stack (hvdps/install/stack.py): auto (2.21.0 with tf-keras on Python 3.10-3.13, 2.18.1 on 3.9),
# 2.21, 2.18 or 2.15 (2.15.1, Python 3.9-3.11). The stamp names it, so another TF= sets up again. A method
# that needs more than pip's dependencies has an install step of its own (<name>_train/install.py:
# --install after TensorFlow, --verify once hvdps is installed): Horovod 0.28.1 is compiled against the
# stack with patches/horovod-0.28.1.patch (horovod_train/install.py) and the wheel cached by Horovod,
# TensorFlow, Python, MPI and patch in ~/.cache/hvdps (HVDPS_CACHE): a later set-up on this machine, in
# any clone, installs it instead of compiling for 15 minutes.
TF       ?= auto
STAMP    := $(VENV)/.hvdps-ready-tf$(TF)
METHOD_INSTALLS := $(sort $(wildcard *_train/install.py))
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The interpreter set-up checks: the venv's once it exists, else the one it would be made from.
SETUP_PY  = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
DEMO_MLP_EPOCHS ?= 15
DEMO_CNN_EPOCHS ?= 3
# The environment of the processes the project starts (Open MPI as root, quiet TF, the repo on
# PYTHONPATH) is set in one place: common/base/procs.py:child_env, used by every launcher and the tests.

.PHONY: setup demo test fuzz bench emulate emulate-scale slurm clean-venv

setup: $(STAMP)

$(STAMP): setup.py Makefile hvdps/install/stack.py $(METHOD_INSTALLS) $(wildcard patches/*.patch) common/native/bind_to.c
	@out=$$($(SETUP_PY) hvdps/install/stack.py "$(TF)" 2>/dev/null) || { \
	  echo "$${out:-error: $(SETUP_PY) is not a Python 3 interpreter: run make PYTHON=python3.12}"; exit 1; }
	@command -v mpirun >/dev/null && command -v patch >/dev/null && [ -e /usr/include/x86_64-linux-gnu/openmpi/include/mpi.h -o -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] \
	  || { echo "== installing Open MPI from Debian"; \
	       $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	       $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin iproute2 patch >/dev/null; }
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || { echo "== installing SLURM and munge from Debian (make slurm, tests/test_slurm.py)"; \
	  { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null; } \
	  || echo "note: SLURM could not be installed; make slurm and the SLURM test need slurmctld slurmd slurm-client munge"; }
	@[ -x $(BIN)/python ] || { echo "== creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "== installing TensorFlow and build tools"
	@$(BIN)/pip install -q --upgrade pip setuptools wheel
	@$(BIN)/pip uninstall -q -y tensorflow-cpu 2>/dev/null || true   # every stack is tensorflow (hvdps/install/stack.py)
	@pins=$$($(BIN)/python hvdps/install/stack.py "$(TF)") && $(BIN)/pip install -q $$pins "cmake<4" packaging && \
	  case "$$pins" in *tf-keras*) ;; *) $(BIN)/pip uninstall -q -y tf-keras 2>/dev/null || true;; esac
	@for step in $(METHOD_INSTALLS); do $(BIN)/python $$step --install || exit 1; done
	@echo "== installing hvdps and test tools"
	@$(BIN)/pip install -q -e ".[test]"
	@# the checkout itself on sys.path, beside pip's editable map of today's packages: a new method package
	@# (<name>_train/, which hvdps/methods.py finds by its folder) imports without installing again
	@echo "$(CURDIR)" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/hvdps-checkout.pth"
	@echo "== building the bind shim (local servers listen on loopback / their own address only)"
	@cc -shared -fPIC -O2 -Wall -o common/native/libhvdps_bind.so common/native/bind_to.c -ldl
	@for step in $(METHOD_INSTALLS); do $(BIN)/python $$step --verify || exit 1; done
	@touch $@

# Three workloads: the MLP at batch 32 (little compute per byte exchanged: communication/latency-bound),
# the CNN at batch 64 on 28x28 digits (compute-bound), and rec on the clicks log (4 embedding tables of
# 100,000 x 16: a sparse gradient of ~18 kB of looked-up rows against 25.6 MB of tables, the regime where
# a PS's sparse pull/push should beat a dense all-reduce; Horovod both ways, TF's all-reduce all-gathers
# the rows). One merged report: runs/demo-*/report.md, with each run's start-up, warm-up share and
# teardown. --warmup_steps 4 = the first logging interval (tracing, first exchange or session run). The
# MLP evaluates only at the end (an evaluation per epoch would weigh on its 1 ms steps); the CNN and rec
# evaluate every epoch, so their verdicts' time to the target accuracy is measured. The sizes are the
# first answer's (7 min 36 s here, 36 runs): every method reaches the CNN's 0.9 by its third epoch and rec's
# 0.75 by its second, and the compute probe times 20 steps. Raise DEMO_MLP_EPOCHS / DEMO_CNN_EPOCHS (and
# DEMO_ARGS="--probe_steps 50") for steadier figures. DEMO_ARGS ends each of the three comparisons'
# flags, so its own win (e.g. --train_steps 12 for a quick look, --backends horovod for one method).
# Last, a slow worker (root: the kernel's CPU cgroup): worker 1 of 2 at a quarter of its CPU under bare
# MPI and async PS, beside their healthy runs, in a report of its own (runs/demo-*/straggler).
DEMO_OUT := runs/demo-$(shell date +%Y%m%d-%H%M%S)
DEMO_WORKERS ?= 1,2
DEMO_ARGS ?=
DEMO_COMMON := --workers $(DEMO_WORKERS) --checkpoint_every_epoch false --no_progress --log_every 4 --warmup_steps 4 \
    --probe_steps 20
DEMO_REC_EPOCHS ?= 2
# The transformer (tiny preset) on the standard library's source, in the precision --precision auto picks, at 2 workers:
# Horovod, bare MPI and sync PS, evaluated every 100 updates so that the time to its 0.52 next-byte
# accuracy is measured within DEMO_LM_STEPS (BENCHMARKS.md section 24: each of them passes it by update
# 600, local SGD and gossip by 700; async PS, whose stale gradients cost it accuracy, only after 1,400).
DEMO_LM_STEPS ?= 600
# Then a short tune of the MLP (each method's settings searched, its best beside its defaults:
# runs/demo-*/tune/report.md), bounded by DEMO_TUNE_BUDGET seconds; DEMO_TUNE_ARGS ends its flags.
DEMO_TUNE_BUDGET ?= 150
DEMO_TUNE_ARGS ?=
demo: setup
	-$(BIN)/hvdps compare $(DEMO_COMMON) --backends horovod,mpi,localsgd:8,mwms,ps --eval_every_epoch false --model mlp \
	    --batch_size 32 --epochs $(DEMO_MLP_EPOCHS) --out $(DEMO_OUT)/mlp $(DEMO_ARGS)
	-$(BIN)/hvdps compare $(DEMO_COMMON) --backends horovod,mpi,localsgd:8,mwms,ps --model cnn --dataset examples/digits28.py:load \
	    --batch_size 64 --epochs $(DEMO_CNN_EPOCHS) --out $(DEMO_OUT)/cnn $(DEMO_ARGS)
	-$(BIN)/hvdps compare $(DEMO_COMMON) --backends horovod,horovod:sparse_as_dense,mpi,mwms,ps --model rec \
	    --dataset clicks --batch_size 64 --epochs $(DEMO_REC_EPOCHS) --target_accuracy 0.75 --out $(DEMO_OUT)/rec $(DEMO_ARGS)
	-$(BIN)/hvdps compare --workers 2 --backends horovod,mpi,ps:sync --model transformer --dataset pysrc \
	    --train_steps $(DEMO_LM_STEPS) --eval_every_steps 100 --eval_every_epoch false --checkpoint_every_epoch false \
	    --log_every 20 --probe_steps 20 --no_progress --out $(DEMO_OUT)/lm $(DEMO_ARGS)
	$(BIN)/hvdps compare --from $(DEMO_OUT)/mlp/runs $(DEMO_OUT)/cnn/runs $(DEMO_OUT)/rec/runs $(DEMO_OUT)/lm/runs --out $(DEMO_OUT)
	-$(BIN)/hvdps project --from $(DEMO_OUT)/cnn/runs --bandwidth_gbps 25 --latency_us 10 \
	    --max_workers 64 --out $(DEMO_OUT)/projection
	-$(SUDO) $(BIN)/hvdps compare --workers 2 --backends mpi,ps:async --straggler 1:4 --model mlp --train_steps 300 \
	    --no_progress --out $(DEMO_OUT)/straggler $(DEMO_ARGS)
	-$(BIN)/hvdps tune --workers 2 --model mlp --backends horovod,mpi,mwms,ps --budget $(DEMO_TUNE_BUDGET) \
	    --no_progress --out $(DEMO_OUT)/tune $(DEMO_TUNE_ARGS)

# The comparison on an emulated cluster (root: network namespaces, tc tbf): EMU_HOSTS hosts, each link
# EMU_RATE both ways, slow enough that the exchange dominates the MLP's step (1024 hidden units: M =
# 307 kB of gradient per step). Ring (Horovod, bare MPI, TF's MultiWorkerMirrored) against PS sync/async and TF2's PS with 1 and
# 2 shards at 1-3 workers; the report shows the bytes each link carried against the formulas.
# EMU_COMPARE is the comparison's own flags.
EMU_HOSTS ?= 5
EMU_RATE ?= 50mbit
EMU_COMPARE ?= --workers 1,2,3 --backends horovod,mpi,mwms,ps,ps2 --num_ps 1,2 --model mlp --hidden_units 1024 \
    --batch_size 32 --train_steps 40 --log_every 5 --warmup_steps 10
emulate: setup
	$(SUDO) $(BIN)/hvdps emulate --hosts $(EMU_HOSTS) --rate $(EMU_RATE) --out runs/emulate-$(shell date +%Y%m%d-%H%M%S) -- \
	    $(EMU_COMPARE) --eval_every_epoch false --checkpoint_every_epoch false --no_progress

# The same at the scale users run (root, 20 emulated hosts, 20 TensorFlow processes at most): every
# worker and PS task on a host of its own; the rings (Horovod, bare MPI, TF's MultiWorkerMirrored) against
# classic PS sync and async and TF2's PS with 1, 2 and 4 shards, at 2, 4, 8 and 16 workers. Then the
# projection from those runs: measured against projected for every run, and the crossover (from which n
# the ring beats one PS, the PS shards that match it) as a table and a plot, in OUT/projection.
EMU_SCALE_HOSTS ?= 20
EMU_SCALE_OUT := runs/emulate-scale-$(shell date +%Y%m%d-%H%M%S)
EMU_SCALE_COMPARE ?= --workers 2,4,8,16 --backends horovod,mpi,mwms,ps,ps2 --num_ps 1,2,4 --model mlp \
    --hidden_units 1024 --batch_size 32 --train_steps 30 --log_every 5 --warmup_steps 10 --run_timeout 600
emulate-scale: setup
	-$(SUDO) $(BIN)/hvdps emulate --hosts $(EMU_SCALE_HOSTS) --rate $(EMU_RATE) --out $(EMU_SCALE_OUT) -- \
	    $(EMU_SCALE_COMPARE) --eval_every_epoch false --checkpoint_every_epoch false --no_progress
	$(BIN)/hvdps project --from $(EMU_SCALE_OUT) --out $(EMU_SCALE_OUT)/projection

# The shipped SLURM scripts and the comparison under a real SLURM (root): slurmctld and munged on the
# emulated login node, one slurmd per emulated host; each script is submitted with sbatch (its runs and
# output under OUT/sbatch), then hvdps compare runs inside an allocation of every host (salloc,
# --hosts slurm). SLURM_TRAIN_ARGS sizes the scripts' training (their HVDPS_TRAIN_ARGS); SLURM_JOBS is the
# scripts submitted (each --sbatch "[VAR=value ...] script"), SLURM_COMPARE the comparison's workers and backends.
SLURM_HOSTS ?= 3
SLURM_TRAIN_ARGS ?= --model mlp --epochs 3 --batch_size 32
SLURM_JOBS ?= --sbatch hostfiles/slurm/horovod.sbatch --sbatch "HVDPS_LAUNCH=mpirun hostfiles/slurm/horovod.sbatch" \
    --sbatch "PS_MODE=async hostfiles/slurm/ps.sbatch" --sbatch "PS_MODE=sync hostfiles/slurm/ps.sbatch" \
    --sbatch "PS_MODE=v2 hostfiles/slurm/ps.sbatch" --sbatch hostfiles/slurm/mwms.sbatch
SLURM_COMPARE ?= --workers 1,2 --backends horovod,mpi,mwms,ps,ps:sync
slurm: setup
	$(SUDO) env HVDPS_TRAIN_ARGS="$(SLURM_TRAIN_ARGS)" $(BIN)/hvdps emulate --slurm --hosts $(SLURM_HOSTS) --rate 1gbit \
	    --out runs/slurm-$(shell date +%Y%m%d-%H%M%S) $(SLURM_JOBS) -- \
	    $(SLURM_COMPARE) $(SLURM_TRAIN_ARGS) --eval_every_epoch false --checkpoint_every_epoch false --no_progress

# PYTEST_ARGS picks part of the suite: make test PYTEST_ARGS="-m unit tests". The whole suite runs two tests at
# a time (pytest-xdist; the root tier and each shared job on one worker: tests/conftest.py), then the tests
# that need the machine to themselves (marked alone: a CPU hog against none) one after another, with nothing
# else of the suite beside them (when PYTEST_ARGS is not given: make test PYTEST_ARGS="-m alone tests" runs
# only those). Every test's duration: make test DURATIONS=0.
PYTEST_ARGS ?= -n 2 --dist loadgroup -m "not alone" tests
DURATIONS ?= 15
test: setup
	$(BIN)/python -m pytest -q --timeout 900 --durations=$(DURATIONS) $(PYTEST_ARGS)
	$(if $(filter file,$(origin PYTEST_ARGS)),$(BIN)/python -m pytest -q --timeout 900 --durations=$(DURATIONS) -m alone tests)

# The property-based suites (tests/test_fuzz.py) at length: FUZZ_EXAMPLES per property, a new seed each
# run unless FUZZ_SEED is set (the seed a failing run printed, to draw its examples again), with
# Hypothesis' statistics (examples run, taken, refused). The unit tier runs them derandomized.
FUZZ_EXAMPLES ?= 2000
FUZZ_SEED ?=
fuzz: setup
	@case "$(FUZZ_EXAMPLES)" in ''|*[!0-9]*|0) echo "error: FUZZ_EXAMPLES=$(FUZZ_EXAMPLES): a whole number of examples per property, at least 1"; exit 2;; esac
	HVDPS_FUZZ=1 HVDPS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider -p no:warnings \
	    --hypothesis-show-statistics $(if $(FUZZ_SEED),--hypothesis-seed=$(FUZZ_SEED)) tests/test_fuzz.py

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean-venv:
	rm -rf $(VENV)
