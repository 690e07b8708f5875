# Two commands for learners: `make lab` and `make test`.
# Both create .venv on first use (python3 >= 3.11) and reuse it afterwards.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
KERNEL := posenc
STAMP  := $(VENV)/.installed

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export HF_DATASETS_DISABLE_PROGRESS_BARS := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONHASHSEED := 0

.PHONY: lab test unit nbval bench env clean kernel book

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

env: $(STAMP)

kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --user --name $(KERNEL) --display-name "Python (posenc)" >/dev/null

lab: env kernel
	HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 $(BIN)/jupyter lab --notebook-dir=notebooks

# worker processes of the tests (pytest-xdist): each test file, and each notebook with its cells in order, runs
# whole in one worker. A unit test uses one torch thread (tests/conftest.py), so 2 fill 2 cores;
# TEST_WORKERS=0 runs everything in this one process
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg notebooks

unit: env
	$(PYTEST) tests

nbval: env
	$(PYTEST) $(NBVAL)

test: env
	$(PYTEST) tests
	$(PYTEST) $(NBVAL)

# the suite, then its batch axis (train_batches.json, memory_batches.json) into the same new runs/ folder
BENCH_BATCHES ?= 1,2,8,16
BENCH_BATCH_LENGTHS ?= 512,1024
bench: env
	out=runs/bench-$$(date -u +%Y%m%d-%H%M%S) && $(BIN)/python -m benchmarks.run --out $$out && \
	$(BIN)/python -m benchmarks.run --out $$out --only train,memory --schemes t5,alibi,shaw,xlnet,deberta \
	    --lengths $(BENCH_BATCH_LENGTHS) --batches $(BENCH_BATCHES)

# the course website from the committed notebooks (no re-execution) -> build/book/html
book: env
	$(BIN)/python -m book.build

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
