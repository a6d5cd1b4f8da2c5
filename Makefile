# lossless: every target is documented by `make help`.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

GO        ?= go
TOOL      := $(GO) tool -modfile=tools/go.mod
BIN_DIR   ?= bin
# One per services/<name>/service.json; cmd/newservice appends, deploy/deploytest checks.
SERVICES  := workorder provider-sim console billing
COMMANDS  := pubsub-emulator healthcheck localissuer
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
test: ## Run every test (unit, integration on real PostgreSQL and Pub/Sub emulator) under -race, in the main, deploy/ and bench/report/ modules.
	$(GO) test $(GO_TEST_FLAGS) ./...
	cd deploy && $(GO) test $(GO_TEST_FLAGS) ./...
	cd bench/report && $(GO) test $(GO_TEST_FLAGS) ./...

.PHONY: lint
lint: ## Run gofmt, go vet, buf lint and golangci-lint (main, deploy/ and bench/ modules).
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy && $(GO) vet ./...
	$(TOOL) buf lint
	$(TOOL) golangci-lint run ./...
	cd deploy && $(GO) tool -modfile=../tools/go.mod golangci-lint run ./...
	@# The bench/ modules (their own go.mod each) are not reached by ./... either.
	for m in bench/report bench/watermill-compare bench/river-compare; do \
		(cd $$m && $(GO) vet ./... && $(GO) tool -modfile=../../tools/go.mod golangci-lint run ./...) || exit 1; \
	done

.PHONY: proto
proto: ## Regenerate Go, gRPC, gateway and OpenAPI code from proto/, and pkg/'s test protos (offline).
	rm -rf gen pkg/internal/testpb pkg/operator/opsv1
	$(TOOL) buf generate
	$(TOOL) buf generate --template pkg/internal/testproto/buf.gen.yaml
	$(TOOL) buf generate --template pkg/operator/buf.gen.yaml

.PHONY: new-service
new-service: ## Scaffold a service with API, database, outbox, tests and deployment, e.g. make new-service NAME=shipping.
	$(GO) run ./cmd/newservice -name "$(NAME)"

.PHONY: check-generated
check-generated: proto ## Fail when committed generated code differs from its protos.
	@git add -N gen pkg/internal/testpb pkg/operator/opsv1 >/dev/null 2>&1 || true
	@git diff --exit-code --stat -- gen pkg/internal/testpb pkg/operator/opsv1 || { echo "generated code is out of sync with its protos: run 'make proto' and commit"; exit 1; }

# Built, then exec'd: `go run` exits 1 when it sees the Ctrl-C, whatever runlocal's status.
.PHONY: run
run: ## Run the whole system locally without Docker (PostgreSQL, Pub/Sub emulator, services); Ctrl-C stops it.
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/runlocal ./cmd/runlocal
	exec $(BIN_DIR)/runlocal

# The targets below work on the stack `make run` started in another terminal, found through the file
# it writes (.run/env, or RUNLOCAL_ENV_FILE; internal/runenv); each fails, saying so, when none runs.
# ARGS is taken unexpanded ($(value ...)) and split by the shell, so quotes and "$USER" in it work as
# on a command line.
LOCALOPS = @mkdir -p $(BIN_DIR) && $(GO) build -o $(BIN_DIR)/localops ./cmd/localops && exec $(BIN_DIR)/localops

.PHONY: psql
psql: ## psql on a service's database of the running `make run`, e.g. make psql SERVICE=workorder.
	$(LOCALOPS) psql '$(SERVICE)'

.PHONY: ops
ops: ## A service's command line against the running `make run`, e.g. make ops SERVICE=workorder ARGS="inbox list --status PARKED".
	@args='$(subst ','\'',$(value ARGS))'; eval "set -- $$args"; \
		mkdir -p $(BIN_DIR) && $(GO) build -o $(BIN_DIR)/localops ./cmd/localops && exec $(BIN_DIR)/localops ops '$(SERVICE)' "$$@"

.PHONY: metrics
metrics: ## The stall gauges (outbox, inbox, dead letters, dead jobs) of every service of the running `make run`, one table.
	$(LOCALOPS) metrics

.PHONY: trace
trace: ## One order's spans across its linked traces, as a tree with durations, from the running `make run`, e.g. make trace ORDER=<id> (QUERIES=1: with database spans).
	$(LOCALOPS) trace $(if $(QUERIES),-queries) '$(ORDER)'

.PHONY: token
token: ## Print an ID token of the demo client from the running `make run`'s local issuer, e.g. curl -H "authorization: Bearer $$(make -s token)"; AUDIENCE=billing for billing.
	$(LOCALOPS) token '$(AUDIENCE)'

.PHONY: demo
demo: ## Create orders against a running stack and print a summary, e.g. make demo ARGS="-n 200 -faults duplicate=0.2".
	$(GO) run ./cmd/demo $(ARGS)

# bench/raw*.json and bench/data are the run's raw output (not committed); bench/report.md and bench/plots
# are written from them. B2 and B6 run at their design length: B2's targets are defined over 5 min and
# 60 s after the release (vacuum's catch-up), B6's against the drain of 10,000 orders, whose one-deadline
# tail of timed-out calls outweighs a shorter run (docs/performance.md). The pattern packages' benchmarks
# (bench/outbox, bench/outboxpubsub, bench/leasequeue) are packages of the main module, which ./... reaches; the
# fsync and pg_stat_statements knobs reach pkg/pgtest through internal/benchkit. The watermill and River comparisons are
# modules of their own, which `./...` does not reach: each runs as bench-watermill / bench-river does, with
# -json. The report is written even when a benchmark fails (its row says so); the target then exits non-zero.
BENCH_DATA ?= bench/data

.PHONY: bench
bench: ## Run every benchmark of docs/performance.md once, fsync on; writes bench/report.md (targets, figures, plots).
	@mkdir -p bench $(BENCH_DATA) && rm -f $(BENCH_DATA)/*.csv bench/raw.json bench/raw-watermill.json bench/raw-river.json
	@echo "benchmarks running (up to 90 min); progress: tail -f bench/raw.json"
	@status=0; \
	LOSSLESS_PG_FSYNC=on LOSSLESS_PG_STAT_STATEMENTS=on LOSSLESS_B6_ORDERS=10000 \
		OUTBOX_B2_SUSTAIN=5m OUTBOX_B2_HOLD=60s OUTBOX_B2_AFTER=60s OUTBOX_B2_BACKLOG=10000000 LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
		$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 90m ./... > bench/raw.json || status=1; \
	if [ -d bench/watermill-compare ]; then \
		(cd bench/watermill-compare && LOSSLESS_PG_FSYNC=on LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
			$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 60m .) > bench/raw-watermill.json || status=1; \
	fi; \
	if [ -d bench/river-compare ]; then \
		(cd bench/river-compare && LOSSLESS_PG_FSYNC=on LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
			$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 60m .) > bench/raw-river.json || status=1; \
	fi; \
	(cd bench/report && $(GO) run . -raw '$(abspath bench/raw.json)' -raw '$(abspath bench/raw-watermill.json)' \
		-raw '$(abspath bench/raw-river.json)' \
		-data '$(abspath $(BENCH_DATA))' -out '$(abspath bench/report.md)') || status=1; \
	echo "wrote bench/report.md"; exit $$status

# A module of its own, so that watermill stays out of the main go.mod; `go test ./...` does not reach it.
# A relative LOSSLESS_BENCH_DATA is made absolute: the test runs in the module's directory.
.PHONY: bench-watermill
bench-watermill: ## B1w: our outbox relay vs watermill-sql's forwarder draining the same backlog on one server, fsync on.
	cd bench/watermill-compare && $(if $(LOSSLESS_BENCH_DATA),LOSSLESS_BENCH_DATA='$(abspath $(LOSSLESS_BENCH_DATA))') LOSSLESS_PG_FSYNC=on $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m .

# A duration (30s) or a count of executions (100000x). With a duration, Go 1.26's fuzz coordinator can report
# "context deadline exceeded" as a failure, with no failing input written, when the time runs out while a worker
# is mid-call (fixed in Go 1.27); a count cannot race that deadline, which is why .ci/run uses one.
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
ci: check-generated tidy-check proto-breaking lint test ## What .ci/run runs after installing prerequisites (make test runs every seed corpus).

# Every module of the repository: the main one, tools/, deploy/, bench/*/.
GO_MODULES = $(sort $(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*')))

.PHONY: tidy-check
tidy-check: ## Fail, naming the file, when `go mod tidy` would change a go.mod or go.sum of any module.
	@fail=0; for dir in $(GO_MODULES); do \
		if ! diff=$$(cd $$dir && $(GO) mod tidy -diff 2>&1); then \
			files=$$(printf '%s\n' "$$diff" | sed -n 's|^--- current/||p' | sed "s|^|$${dir#./}/|" | tr '\n' ' '); \
			echo "go mod tidy would change $${files:-$$dir (go mod tidy failed)}: run 'cd $$dir && go mod tidy' and commit"; \
			printf '%s\n' "$$diff"; fail=1; \
		fi; \
	done; exit $$fail

# buf fetches the branch from the local .git: a clone of main has refs/heads/main;
# a pull-request checkout in CI (fetch-depth 0) has only refs/remotes/origin/main.
# Only the proto/ module: buf compares workspaces module by module and fails
# outright when their number differs, and pkg/'s test protos promise nothing.
.PHONY: proto-breaking
proto-breaking: ## Fail when proto/ breaks compatibility (buf FILE rules) with the main branch.
	@ref=main; git rev-parse -q --verify refs/heads/main >/dev/null || ref=origin/main; \
		echo "buf breaking proto --against '.git#branch=$$ref,subdir=proto'"; \
		$(TOOL) buf breaking proto --against ".git#branch=$$ref,subdir=proto"

.PHONY: terraform-topology
terraform-topology: ## Regenerate deploy/terraform/gcp/topology.json from services/*/service.json (the topology `provision` creates); commit it.
	$(GO) test ./internal/topology -run TestTerraformTopology -update

.PHONY: k8s-rules
k8s-rules: ## Regenerate deploy/k8s/overlays/gcp/monitoring/rules.yaml (Managed Prometheus Rules) from deploy/compose/prometheus/alerts.yml; commit it.
	cd deploy && $(GO) run ./cmd/gmprules

.PHONY: rename
rename: ## Give a fork its module path everywhere (imports, go.mod files, protos, gen/, runbook URLs), e.g. make rename MODULE=github.com/acme/orders.
	@if [ -z "$(MODULE)" ]; then echo "usage: make rename MODULE=github.com/acme/orders"; exit 2; fi
	$(GO) run ./cmd/rename -module '$(MODULE)'

# A module of its own, so that River stays out of the main go.mod; `go test ./...` does not reach it. Sizes
# come from LOSSLESS_B3_JOBS / _WORKERS / _ROUNDS / _CONTINUOUS (bench/river-compare/bench_test.go), e.g.
# make bench-river LOSSLESS_B3_JOBS=200000. A relative LOSSLESS_BENCH_DATA is made absolute: the test runs
# in the module's directory.
.PHONY: bench-river
bench-river: ## B3: pkg/leasequeue vs River v0.51.2 burning down the same jobs with the same workers on one server, fsync on.
	cd bench/river-compare && $(if $(LOSSLESS_BENCH_DATA),LOSSLESS_BENCH_DATA='$(abspath $(LOSSLESS_BENCH_DATA))') LOSSLESS_PG_FSYNC=on $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m .
