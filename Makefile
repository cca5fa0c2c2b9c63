# Fusebox: `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
export FUSEBOX_CACHE ?= $(HOME)/.cache/fusebox
# Nothing here may reach a model hub: models are generated locally.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: help
help: ## List the targets with what each one does
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Set-up
.PHONY: setup setup-system setup-python setup-binaries lock
setup: setup-system setup-python setup-binaries ## Install everything (Debian packages, Python env, cluster binaries); a warm machine rebuilds nothing

setup-system: ## Install the Debian packages the cluster and tests need (runc, CNI plugins, podman, debootstrap, iptables, ipset, promtool)
	@scripts/install-system-packages.sh

setup-python: ## Create the Python environment in the cache (keyed by requirements-dev.lock) and link .venv to it
	@scripts/setup-python.sh

setup-binaries: ## Build etcd, Kubernetes, containerd, helm, CoreDNS, kube-score, kube-router and the simulated-GPU drivers from the pinned Go modules into the cache
	@localcluster/build-binaries.sh

lock: ## Re-resolve requirements-*.in into the committed lock files
	@scripts/lock.sh

##@ Images and cluster
.PHONY: images cluster-up cluster-down cluster-status
images: setup ## Build the base, inference and operator images with podman (layers cached under the cache dir)
	@localcluster/build-images.sh

cluster-up: setup images ## Start localcluster: a real one-node Kubernetes with a simulated GPU, in its own network namespace
	@$(PY) -m localcluster up

cluster-down: ## Stop localcluster and leave the host as it was
	@$(PY) -m localcluster down

cluster-status: ## Show each localcluster component
	@$(PY) -m localcluster status

##@ Tests and checks
.PHONY: test test-unit test-integration test-e2e lint fmt snapshots models bench gpu-check api-docs kube-score
test: setup images ## Run every tier (what CI runs): e2e, with unit and integration beside it; lists the slowest tests
	@scripts/test-all.sh

test-unit: setup ## Pure logic and in-process components (fast; the chart tests need the helm binary)
	@$(PYTEST) tests/unit

test-integration: setup-python ## The real server and sidecar as processes, with the real openai client
	@$(PYTEST) tests/integration

test-e2e: setup images ## Against localcluster (or the cluster FUSEBOX_KUBECONFIG names)
	@$(PYTEST) tests/e2e

lint: setup-python ## ruff (lint + format check) and mypy strict
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check .
	@$(PY) -m mypy

kube-score: setup-python setup-binaries ## kube-score the rendered chart and the operator's children; fails on a CRITICAL not justified in docs/security.md
	@$(PYTEST) tests/unit/helm/test_kube_score.py -q

snapshots: setup-python ## Refresh the operator's golden YAML snapshots (tests/unit/operator/snapshots)
	@FUSEBOX_UPDATE_SNAPSHOTS=1 $(PYTEST) tests/unit/operator -q

models: setup-python ## Generate the tiny and small models into the cache (keyed by the generator's fingerprint), as the tests and benchmarks do
	@$(PY) -c 'from fusebox_server.model.tiny_model import ensure_model; print(ensure_model("tiny")); print(ensure_model("small"))'

bench: setup-python models ## Run every benchmark in bench/suite.py (server, sidecar, operator), writing figures to bench/results/; one whose prerequisite (a cluster) is absent is skipped with the reason; BENCH_ARGS="--list" shows the plan
	@$(PY) -m bench $(BENCH_ARGS)

gpu-check: setup-python models ## On a CUDA machine: drive the leak fault on the GPU and record what each admin action frees
	@$(PY) bench/gpu_check.py --out $${OUT:-bench/results/gpu}

api-docs: setup-python ## Regenerate docs/api.md and the chart's CRD copy from crds/inferenceservice.yaml
	@$(PY) scripts/gen_api_docs.py

fmt: setup-python ## Format and auto-fix with ruff
	@$(PY) -m ruff format .
	@$(PY) -m ruff check --fix .

##@ Demo
.PHONY: demo demo-down
demo: setup images ## Bring up the cluster, install Fusebox with Helm, stream a chat, inject a leak and watch the operator act
	@$(PY) scripts/demo.py

demo-down: cluster-down ## Stop the demo's cluster
