# lossless: every target is documented by `make help`.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

GO        ?= go
TOOL      := $(GO) tool -modfile=tools/go.mod
BIN_DIR   ?= bin
SERVICES  := workorder provider-sim billing
COMMANDS  := pubsub-emulator healthcheck
GO_TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every service and command into ./bin (static binaries).
	@mkdir -p $(BIN_DIR)
	@for s in $(SERVICES); do [ -d services/$$s ] || continue; \
		CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN_DIR)/$$s ./services/$$s || exit 1; done
	@for c in $(COMMANDS); do [ -d cmd/$$c ] || continue; \
		CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN_DIR)/$$c ./cmd/$$c || exit 1; done

.PHONY: test
test: ## Run every test (unit, integration on real PostgreSQL and Pub/Sub emulator) under -race.
	$(GO) test $(GO_TEST_FLAGS) ./...

.PHONY: lint
lint: ## Run gofmt, go vet, buf lint and golangci-lint.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOL) buf lint
	$(TOOL) golangci-lint run ./...

.PHONY: proto
proto: ## Regenerate Go, gRPC, gateway and OpenAPI code from proto/ (offline).
	rm -rf gen
	$(TOOL) buf generate

.PHONY: check-generated
check-generated: proto ## Fail when committed generated code differs from proto/.
	@git add -N gen >/dev/null 2>&1 || true
	@git diff --exit-code --stat -- gen || { echo "generated code is out of sync with proto/: run 'make proto' and commit"; exit 1; }

# Built, then exec'd: `go run` exits 1 when it sees the Ctrl-C, whatever runlocal's status.
.PHONY: run
run: ## Run the whole system locally without Docker (PostgreSQL, Pub/Sub emulator, services); Ctrl-C stops it.
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/runlocal ./cmd/runlocal
	exec $(BIN_DIR)/runlocal

.PHONY: demo
demo: ## Create orders against a running stack and print a summary, e.g. make demo ARGS="-n 200 -faults duplicate=0.2".
	$(GO) run ./cmd/demo $(ARGS)

.PHONY: bench
bench: ## Run the benchmarks (B1-B5 of docs/performance.md) with fsync on; writes bench/report.txt.
	@mkdir -p bench
	LOSSLESS_PG_FSYNC=on $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./... | tee bench/report.txt

FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Fuzz every Fuzz target for FUZZTIME each (default 30s), e.g. make fuzz FUZZTIME=5m; a failing input lands in the package's testdata/fuzz.
	@set -e; for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg services cmd internal | xargs -n1 dirname | sort -u); do \
		for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go | sed 's/^func //'); do \
			echo "fuzz ./$$dir $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./$$dir; \
		done; \
	done

.PHONY: ci
ci: check-generated lint test ## What .ci/run runs after installing prerequisites (make test runs every seed corpus).
