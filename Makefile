# cellblock: the single entry point (DESIGN.md §6). `make` alone lists the targets.
#
# Variables you may override:  make test PYTHON=/path/to/python
#   PYTHON   Python used for setup/tests (default: .venv/bin/python if present, else python3)

.DEFAULT_GOAL := help
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DELETE_ON_ERROR:
MAKEFLAGS += --no-print-directory

PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
DEV_PYTHONPATH := proto:server:client:sandbox-image/guest
STAMPS := build/stamps
# One stamp per Python environment, so switching interpreters reinstalls.
PY_ENV_ID := $(shell $(PYTHON) -c 'import hashlib, sys; print(hashlib.sha256(sys.prefix.encode()).hexdigest()[:12])' 2>/dev/null)
PYDEPS_STAMP := $(STAMPS)/pydeps-$(PY_ENV_ID)
# npm projects: the repo root (buf, MCP servers), tests/interop (grpc-js), tests/frontdoor_ts (the MCP SDK
# client) and clients/typescript (the TypeScript client), where a package.json exists.
NPM_DIRS := $(dir $(wildcard package.json tests/interop/package.json tests/frontdoor_ts/package.json clients/typescript/package.json))
BUF := node_modules/.bin/buf
# Debian packages the Go client and `make proto` need: Go, protoc and its Go plugins, and the
# Go gRPC/protobuf sources the Go client builds against offline (clients/go/build.sh). The
# 1.5 API of github.com/golang/protobuf is named explicitly: grpc's dependency also accepts
# the 1.3 one, which cannot marshal messages made by protoc-gen-go 1.28.
GO_DEBS := golang-go protobuf-compiler libprotobuf-dev protoc-gen-go protoc-gen-go-grpc \
  golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev

.PHONY: help
help: ## Show this help
	@echo "usage: make <target>   (PYTHON=$(PYTHON))"
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) \
	  | awk 'BEGIN { FS = ":.*## " } { printf "  %-18s %s\n", $$1, $$2 }'

# ------------------------------------------------------------------ machine + images

.PHONY: engine
engine: ## Make sure a Docker engine answers (installs docker.io, starts dockerd) and knows gVisor's runsc
	scripts/ensure-docker.sh
	scripts/ensure-runsc.sh

.PHONY: base-image
base-image: engine ## Build the base image cellblock-base:bookworm from Debian packages (debootstrap)
	sandbox-image/bootstrap-base.sh

.PHONY: image
image: engine ## Build the cell image cellblock-cell:dev (fast when nothing changed)
	sandbox-image/build.sh

.PHONY: control-image
control-image: image ## Build the control-service image cellblock-control:dev for Kubernetes (no registry)
	scripts/build-control-image.sh

.PHONY: k8s-profile
k8s-profile: ## Regenerate k8s/base/seccomp/cellblock-cell.json from sandbox-image/seccomp.json (+ the TCP bridge socket rule)
	PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -c 'from cellblock.server.cells import DEFAULT_LOCKDOWN as L; import sys; sys.stdout.write(L.seccomp_text(tcp_bridge=True))' > k8s/base/seccomp/cellblock-cell.json

.PHONY: seccomp-selftest
seccomp-selftest: image ## Check the cell's seccomp profile: needed calls work, removed ones get EPERM
	$(PYTHON) sandbox-image/seccomp-selftest.py

# ------------------------------------------------------------------ developer setup

.PHONY: setup
setup: pydeps npm-deps client-deps postgres image ## Install pinned Python deps, npm tools, Go/protoc, PostgreSQL, the engine and the cell image

.PHONY: postgres
postgres: ## Make sure PostgreSQL's server binaries are installed (run-store tests start throwaway clusters)
	scripts/ensure-postgres.sh

.PHONY: pydeps
pydeps: $(PYDEPS_STAMP) ## Install requirements-dev.txt into PYTHON (skipped while unchanged)

$(PYDEPS_STAMP): requirements-dev.txt
	$(PYTHON) -m pip install --disable-pip-version-check -r requirements-dev.txt
	@mkdir -p $(STAMPS) && touch $@

.PHONY: npm-deps
npm-deps: ## npm ci where a package.json is (repo root, tests/interop, tests/frontdoor_ts, clients/typescript); skipped while the lock is unchanged
	@for d in $(NPM_DIRS); do \
	  done_marker="$${d}node_modules/.package-lock.json"; \
	  if [ -f "$$done_marker" ] && [ "$$done_marker" -nt "$${d}package.json" ] \
	     && [ "$$done_marker" -nt "$${d}package-lock.json" ]; then continue; fi; \
	  if ! command -v npm >/dev/null 2>&1; then \
	    if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "npm not found; installing nodejs and npm from Debian packages"; \
	      DEBIAN_FRONTEND=noninteractive apt-get update -q; \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm; \
	    else echo "npm is needed for $${d}package.json: install Node.js and npm" >&2; exit 1; fi; \
	  fi; \
	  echo "npm ci in $$d"; \
	  (cd "$$d" && npm ci --no-audit --no-fund); \
	  touch "$$done_marker"; \
	done

.PHONY: client-deps
client-deps: npm-deps ## Install Go, protoc and the Go gRPC sources from Debian (apt-get) when missing
	@missing=""; \
	for deb in $(GO_DEBS); do \
	  dpkg-query -W -f='$${Status}' "$$deb" 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$deb"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages for the Go client and protoc:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "the Go client and make proto need these Debian packages:$$missing" >&2; exit 1; fi; \
	fi

# ------------------------------------------------------------------ lead's targets

# Generated code of every client; `make proto-check` fails when it differs from the checkout.
GENERATED := proto clients/typescript/src/gen clients/go/gen

.PHONY: proto
proto: pydeps client-deps ## Regenerate Python (proto/), TypeScript and Go client code (scripts/gen-proto.sh)
	PYTHON=$(PYTHON) scripts/gen-proto.sh

.PHONY: proto-check
proto-check: pydeps client-deps ## Fail when generated code is stale; buf lint and buf breaking the contract
	PYTHON=$(PYTHON) scripts/gen-proto.sh >/dev/null
	git diff --exit-code --stat -- $(GENERATED) || { echo "generated code is stale: run make proto and commit" >&2; exit 1; }
	test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || { git status --short -- $(GENERATED); echo "untracked generated files" >&2; exit 1; }
	cd proto && ../$(BUF) lint && ../$(BUF) breaking --against baseline.binpb

.PHONY: proto-baseline
proto-baseline: npm-deps ## Move the buf breaking baseline to the current protos (an intended API break)
	cd proto && ../$(BUF) build --exclude-source-info -o baseline.binpb
	@echo "proto/baseline.binpb moved: commit it with a message naming the incompatible change"

.PHONY: lint
lint: pydeps npm-deps ## ruff (C901, Google docstrings), mypy --strict, import-linter, module size, buf lint + breaking, tsc, gofmt
	$(PYTHON) -m ruff check server client clients/python sandbox-image/guest tests examples bench scripts
	MYPYPATH=$(DEV_PYTHONPATH) $(PYTHON) -m mypy
	PYTHONPATH=$(DEV_PYTHONPATH):scripts $(PYTHON) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())" --no-cache
	$(PYTHON) scripts/check_module_size.py
	cd proto && ../$(BUF) lint && ../$(BUF) breaking --against baseline.binpb
	clients/typescript/node_modules/.bin/tsc -p clients/typescript --noEmit
	@if command -v gofmt >/dev/null 2>&1; then \
	  unformatted="$$(gofmt -l clients/go)"; \
	  test -z "$$unformatted" || { echo "gofmt needed: $$unformatted" >&2; exit 1; }; \
	else echo "gofmt not found (make client-deps): Go formatting not checked" >&2; fi

.PHONY: test
test: setup ## Run the test suite (after setup): unit, integration (real Docker cells), client conformance (Python/TS/Go), then test-runsc
	TESTCONTAINERS_RYUK_DISABLED=true PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m pytest -q
	$(MAKE) test-runsc-only PYTHON=$(PYTHON)

# The isolation and hostile tests again with every cell under gVisor (scripts/ensure-runsc.sh).
RUNSC_TESTS := tests/integration/test_isolation.py tests/integration/test_hostile.py

.PHONY: test-runsc
test-runsc: setup ## The isolation and hostile tests with CELLBLOCK_OCI_RUNTIME=runsc (gVisor)
	$(MAKE) test-runsc-only PYTHON=$(PYTHON)

.PHONY: test-runsc-only
test-runsc-only:
	CELLBLOCK_OCI_RUNTIME=runsc CELLBLOCK_TEST_TIME_SCALE=2 PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m pytest -q $(RUNSC_TESTS)

.PHONY: test-k8s
test-k8s: pydeps ## The k8s tier against the cluster of KUBECONFIG (k8s/README.md); skips, saying why, without it
	PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m pytest -q -rs -m k8s tests/k8s

.PHONY: test-fast
test-fast: pydeps client-deps ## Everything that needs no Docker or Kubernetes: unit and process tiers (cells as local subprocesses)
	PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m pytest -q -n 2 -m "not docker and not k8s"

.PHONY: test-long
test-long: setup ## Long soaks: 50 crash-consistency rounds per store, 40 concurrent-wait races, the bridge fuzzer with at least 10,000 generated messages (after make test)
	CELLBLOCK_TEST_LONG=1 CELLBLOCK_FUZZ_EXAMPLES=60 TESTCONTAINERS_RYUK_DISABLED=true PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m pytest -q -s -o timeout=3600 \
	  tests/integration/test_crash_consistency.py tests/integration/test_fleet.py tests/integration/test_bridge_fuzz.py

.PHONY: demo
demo: setup ## Start the service on Docker, register examples/, run the example programs, stop
	PYTHONPATH=$(DEV_PYTHONPATH):. $(PYTHON) -m examples.demo

.PHONY: serve
serve: setup ## Run the control service on 127.0.0.1:50051 (CELLBLOCK_* variables configure it)
	PYTHONPATH=$(DEV_PYTHONPATH) $(PYTHON) -m cellblock.server

.PHONY: bench
bench: setup ## Latency, nested calls, resumes, cold start, 16-client throughput, run store (memory:/SQLite/PostgreSQL), noisy neighbour, big final values beside their baselines; tables + build/bench/ CSV and PNG
	PYTHONPATH=$(DEV_PYTHONPATH):. $(PYTHON) -m bench

# ------------------------------------------------------------------ housekeeping

.PHONY: clean
clean: ## Remove build/ (build context, stamps); images and the rootfs cache stay
	rm -rf build clients/typescript/dist clients/go/bin
