# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both create the virtual environment on first use and are no-ops for set-up on later runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
EXTRAS ?= dev,data,export,serve
# the stamp names the set-up's inputs, the extras included: `make EXTRAS=dev,gpu` on an existing .venv installs them
STAMP := $(VENV)/.bertforge-$(shell (cat pyproject.toml scripts/setup-system.sh 2>/dev/null; echo $(EXTRAS)) | cksum | cut -d' ' -f1)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo demo-books test test-slow lint format install clean bench

install: $(STAMP)

$(STAMP): pyproject.toml scripts/setup-system.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# torch first and on its own: a bare `torch` requirement would pull a multi-GB CUDA build
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@bash scripts/setup-system.sh
	@rm -f $(VENV)/.bertforge-* && touch $@

demo: $(STAMP)
	@bash scripts/demo.sh

# ModernBERT-tiny (MODEL=bert: BERT-tiny) on ../shared/corpus/'s books + Wikipedia sample, then fill-mask
# (~15 minutes on 2 cores).
demo-books: $(STAMP)
	@bash scripts/demo_books.sh

test: $(STAMP)
	$(PY) -m pytest -q

# Static checks, configured in pyproject.toml; CI (.ci/run) runs them before the tests. All three run even
# when one fails, and the target fails if any did.
lint: $(STAMP)
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

# Apply the formatter and the safe lint fixes in place.
format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
