# lossless: every target is documented by `make help`.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

GO        ?= go
# The Go release every target builds, tests, lints and scans with: go.mod's toolchain line, the one source
# of truth (every go.mod and both Dockerfiles carry the same release; deploy/deploytest checks them). The go
# command ignores that line under GOTOOLCHAIN=local, which some installations' go.env and actions/setup-go
# set, and would then build with whatever Go is installed; exported here, any Go >= 1.21 on PATH fetches this
# release from the module proxy once and runs it. `make GOTOOLCHAIN=...` overrides it for one run.
GO_TOOLCHAIN := $(shell sed -n 's/^toolchain //p' go.mod)
ifeq ($(GO_TOOLCHAIN),)
$(error go.mod has no toolchain line: it names the Go release every target uses)
endif
GOTOOLCHAIN := $(GO_TOOLCHAIN)
export GOTOOLCHAIN
TOOL      := $(GO) tool -modfile=tools/go.mod
BIN_DIR   ?= bin
# One per services/<name>/service.json; cmd/newservice appends, deploy/deploytest checks.
SERVICES  := workorder provider-sim console billing
COMMANDS  := pubsub-emulator healthcheck localissuer demo
GO_TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: go-version
go-version: ## Print the Go release the targets use (go.mod's toolchain line; fetched from the module proxy on first use).
	$(GO) version

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

.PHONY: model-check
model-check: ## Model-check the protocol with Spin (model/, docs/protocol-model.md): every model holds, every mutant fails.
	model/check.sh

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
run: ## Run the whole system locally without Docker (PostgreSQL, Pub/Sub emulator, services); Ctrl-C stops it. TLS=1: TLS between every process.
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/runlocal ./cmd/runlocal
	TLS=$(TLS) exec $(BIN_DIR)/runlocal

# The targets below work on the stack `make run` started in another terminal, found through the file
# it writes (.run/env, or RUNLOCAL_ENV_FILE; internal/devtools/runenv); each fails, saying so, when none runs.
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

# The network chaos run (e2e/netchaos_test.go, docs/failure-modes.md): two replicas of each service, every
# replica's links through a proxy of internal/testkit/netfault, faults of 30 s and 60 s one link set at a time under
# load. Real packet loss needs root and nft (Debian's nftables); without, the summary says "loss by proxy".
# make test runs the short version (8 s and 15 s windows).
.PHONY: chaos-net
chaos-net: ## The network chaos run at full length: single links cut (half-open), delayed and lossy under load; prints invariants, heal→90 % recovery and fencing refusals.
	LOSSLESS_NETCHAOS=full $(GO) test -count=1 -run '^TestNetworkChaos_' -v -timeout 40m ./e2e

.PHONY: demo
demo: ## Create orders against a running stack and print a summary, e.g. make demo ARGS="-n 200 -faults duplicate=0.2".
	$(GO) run ./cmd/demo $(ARGS)

# bench/raw*.json and bench/data are the run's raw output (not committed); bench/report.md and bench/plots
# are written from them. B2 and B6 run at their design length: B2's targets are defined over 5 min and
# 60 s after the release (vacuum's catch-up), B6's against the drain of 10,000 orders, whose one-deadline
# tail of timed-out calls outweighs a shorter run (docs/performance.md). The pattern packages' benchmarks
# (bench/outbox, bench/outboxpubsub, bench/leasequeue) are packages of the main module, which ./... reaches; the
# fsync and pg_stat_statements knobs reach pkg/pgtest through internal/testkit/benchkit. The watermill and River comparisons are
# modules of their own, which `./...` does not reach: each runs as bench-watermill / bench-river does, with
# -json. The report is written even when a benchmark fails (its row says so); the target then exits non-zero.
BENCH_DATA ?= bench/data

.PHONY: bench
bench: ## Run every benchmark of docs/performance.md once, fsync on; writes bench/report.md (targets, figures, plots).
	@mkdir -p bench $(BENCH_DATA) && rm -f $(BENCH_DATA)/*.csv bench/raw.json bench/raw-watermill.json bench/raw-river.json
	@echo "benchmarks running (up to 5 h with the peer sweeps); progress: tail -f bench/raw*.json"
	@status=0; \
	LOSSLESS_PG_FSYNC=on LOSSLESS_PG_STAT_STATEMENTS=on LOSSLESS_B6_ORDERS=10000 \
		OUTBOX_B2_SUSTAIN=5m OUTBOX_B2_HOLD=60s OUTBOX_B2_AFTER=60s LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
		$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 90m ./... > bench/raw.json || status=1; \
	if [ -d bench/watermill-compare ]; then \
		(cd bench/watermill-compare && LOSSLESS_PG_FSYNC=on LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
			$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 180m .) > bench/raw-watermill.json || status=1; \
	fi; \
	if [ -d bench/river-compare ]; then \
		(cd bench/river-compare && LOSSLESS_PG_FSYNC=on LOSSLESS_BENCH_DATA='$(abspath $(BENCH_DATA))' \
			$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 180m .) > bench/raw-river.json || status=1; \
	fi; \
	(cd bench/report && $(GO) run . -raw '$(abspath bench/raw.json)' -raw '$(abspath bench/raw-watermill.json)' \
		-raw '$(abspath bench/raw-river.json)' \
		-data '$(abspath $(BENCH_DATA))' -out '$(abspath bench/report.md)') || status=1; \
	echo "wrote bench/report.md"; exit $$status

# B7 alone (it is part of `make bench`): one stack, its services' PostgreSQL links delayed by each round-trip
# time of LOSSLESS_B7_RTTS in turn (e2e/b7_bench_test.go). Its row, Details and plots replace B7's in
# bench/report.md (bench/report -merge), whose Environment then names this run beside the full one; the
# rest of the report stays the last `make bench`'s. Progress: tail -f bench/raw-b7.json.
B7_DATA ?= bench/data/b7

.PHONY: bench-distance
bench-distance: ## B7 alone: capacity, p50 create→invoiced and statements per order with 0, 1, 5 and 20 ms added between the services and PostgreSQL, fsync on; merged into bench/report.md.
	@mkdir -p '$(B7_DATA)' && rm -f '$(B7_DATA)'/*.csv bench/raw-b7.json
	@status=0; \
	LOSSLESS_BENCH_DATA='$(abspath $(B7_DATA))' LOSSLESS_PG_FSYNC=on LOSSLESS_PG_STAT_STATEMENTS=on \
		$(GO) test -json -run '^$$' -bench '^BenchmarkB7_Distance$$' -benchtime 1x -timeout 30m ./e2e > bench/raw-b7.json || status=1; \
	$(call bench_merge,B7,bench/raw-b7.json,$(B7_DATA)); exit $$status

# B5 alone (it is part of `make bench`): the whole pipeline's capacity, latency at 10 % and 50 % of it, and its
# per-hop commits, round trips and CPU per order (e2e/bench_test.go, e2e/hopcost_bench_test.go), at the
# knobs `make bench` runs it with. Merged into bench/report.md like bench-distance. About 5 minutes.
B5_DATA ?= bench/data/b5

.PHONY: bench-pipeline
bench-pipeline: ## B5 alone: capacity, p50/p99 create→invoiced at 10 % and 50 % load, commits, round trips and CPU per order per hop and process, fsync on; merged into bench/report.md.
	@mkdir -p '$(B5_DATA)' && rm -f '$(B5_DATA)'/*.csv bench/raw-b5.json
	@status=0; \
	LOSSLESS_BENCH_DATA='$(abspath $(B5_DATA))' LOSSLESS_PG_FSYNC=on LOSSLESS_PG_STAT_STATEMENTS=on \
		$(GO) test -json -run '^$$' -bench '^BenchmarkB5_EndToEndLatency$$' -benchtime 1x -timeout 30m ./e2e > bench/raw-b5.json || status=1; \
	$(call bench_merge,B5,bench/raw-b5.json,$(B5_DATA)); exit $$status

# $(call bench_merge,ID,RAW,DATA), in a recipe that set status: splices the run of one benchmark (its
# go test -json output RAW, its series in DATA) into bench/report.md (bench/report -merge) and shows its row.
bench_merge = (cd bench/report && $(GO) run . -raw '$(abspath $(2))' -data '$(abspath $(3))' \
		-merge '$(abspath bench/report.md)' -out '$(abspath bench/report.md)') || status=1; \
	grep '^| $(1) |' bench/report.md

# A/B of the whole stack: BASE (any git revision) checked out with `git worktree add` into a temporary
# directory, both it and the working tree built as `make build` builds (BIN_DIR), then e2e's
# BenchmarkAB_Capacity runs B5's capacity probe and a 50 % load phase on each, A B then B A, against one
# PostgreSQL server (fsync and pg_stat_statements on) and prints the ratios B/A. BASE's stack must keep
# the env/config contract of the working tree's internal/devtools/localstack. AB_ROUNDS, AB_CAPACITY_N and
# AB_DURATION are the knobs (LOSSLESS_AB_*: e2e/ab_bench_test.go); AB_DIR keeps the builds.
BASE ?= HEAD
AB_DIR ?= $(BIN_DIR)/ab
AB_ROUNDS ?= 2
AB_CAPACITY_N ?= 300
AB_DURATION ?= 20s

.PHONY: bench-ab
bench-ab: ## A/B: B5's capacity probe and 50 % load on the stack at BASE=<rev> and on the working tree, alternating; prints the ratios B/A.
	@rev=$$(git rev-parse --verify '$(BASE)^{commit}') || exit 1; \
	{ git worktree remove --force '$(abspath $(AB_DIR))/src' 2>/dev/null; true; } && rm -rf '$(abspath $(AB_DIR))' && mkdir -p '$(abspath $(AB_DIR))' && \
	git worktree add --quiet --detach '$(abspath $(AB_DIR))/src' $$rev && \
	trap "git worktree remove --force '$(abspath $(AB_DIR))/src'" EXIT && \
	echo "A = $(BASE) ($$rev), B = working tree ($$(git rev-parse --short HEAD)$$(git diff --quiet HEAD || echo +dirty))" && \
	$(MAKE) --no-print-directory -C '$(abspath $(AB_DIR))/src' build BIN_DIR='$(abspath $(AB_DIR))/base' GO='$(GO)' && \
	$(MAKE) --no-print-directory build BIN_DIR='$(abspath $(AB_DIR))/head' && \
	$(if $(LOSSLESS_BENCH_DATA),LOSSLESS_BENCH_DATA='$(abspath $(LOSSLESS_BENCH_DATA))') LOSSLESS_PG_FSYNC=on LOSSLESS_PG_STAT_STATEMENTS=on \
		LOSSLESS_AB_BASE_BIN='$(abspath $(AB_DIR))/base' LOSSLESS_AB_HEAD_BIN='$(abspath $(AB_DIR))/head' \
		LOSSLESS_AB_BASE_REV=$$rev LOSSLESS_AB_ROUNDS=$(AB_ROUNDS) LOSSLESS_AB_CAPACITY_N=$(AB_CAPACITY_N) LOSSLESS_AB_DURATION=$(AB_DURATION) \
		$(GO) test -run '^$$' -bench '^BenchmarkAB_Capacity$$' -benchtime 1x -timeout 120m ./e2e

# A module of its own, so that watermill stays out of the main go.mod; `go test ./...` does not reach it.
# The sweep (LOSSLESS_B1W_EVENTS / _ADAPTERS / _ROUNDS, bench/watermill-compare/bench_test.go) takes about
# an hour, most of it watermill's default adapter on the 500k backlog. Like bench-distance, its row,
# Details and series replace B1w's in bench/report.md (bench/report -merge); its series land in B1W_DATA.
# Progress: tail -f bench/raw-watermill.json.
B1W_DATA ?= bench/data/b1w

.PHONY: bench-watermill
bench-watermill: ## B1w: our outbox relay vs watermill-sql's forwarder at its best adapter per backlog size, one server, fsync on; merged into bench/report.md.
	@mkdir -p '$(B1W_DATA)' && rm -f '$(B1W_DATA)'/*.csv bench/raw-watermill.json
	@status=0; \
	(cd bench/watermill-compare && LOSSLESS_BENCH_DATA='$(abspath $(B1W_DATA))' LOSSLESS_PG_FSYNC=on \
		$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 180m .) > bench/raw-watermill.json || status=1; \
	$(call bench_merge,B1w,bench/raw-watermill.json,$(B1W_DATA)); exit $$status

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
ci: check-generated tidy-check proto-breaking lint vulncheck test ## What .ci/run runs after installing prerequisites (make test runs every seed corpus).

# Every module of the repository: the main one, tools/, deploy/, bench/*/.
GO_MODULES = $(sort $(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*' -not -path './.cache/*')))

# The Go vulnerability database govulncheck reads, built offline and reproducibly from the golang.org/x/vulndb
# module at VULNDB_VERSION (a pseudo-version: bump it to take newer reports): its data/osv reports, indexed by
# its own cmd/indexdb into the layout `govulncheck -db file://` reads, in .cache/vulndb/<version>, built once
# per version. VULNDB=https://vuln.go.dev scans against the live database instead (the GitHub workflow does).
VULNDB_VERSION ?= v0.0.0-20261105234957-e22db6528018
VULNDB_DIR     := .cache/vulndb/$(VULNDB_VERSION)
VULNDB         ?= file://$(abspath $(VULNDB_DIR))

$(VULNDB_DIR)/index/db.json:
	@echo "vulncheck: building the vulnerability database of golang.org/x/vulndb@$(VULNDB_VERSION) in $(VULNDB_DIR)"
	@src=$$($(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
		if [ ! -d "$$src/data/osv" ]; then echo "vulncheck: golang.org/x/vulndb@$(VULNDB_VERSION) has no data/osv"; exit 1; fi; \
		rm -rf '$(VULNDB_DIR).tmp' && \
		$(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns "$$src/data/osv" -out '$(VULNDB_DIR).tmp' && \
		rm -rf '$(VULNDB_DIR)' && mv '$(VULNDB_DIR).tmp' '$(VULNDB_DIR)'

# govulncheck (tools/go.mod) on every module, the standard library of GOTOOLCHAIN included: its packages
# (./..., tests excluded: what ships) and the tools its go.mod declares (tools/: buf, golangci-lint, ...). It
# exits non-zero, printing each finding with a call path, when code calls a vulnerable function; vulnerabilities
# only in imported packages or required modules that nothing calls are counted in its summary and do not fail.
.PHONY: vulncheck
vulncheck: $(if $(filter file://$(abspath $(VULNDB_DIR)),$(VULNDB)),$(VULNDB_DIR)/index/db.json) ## Fail when code of any module calls a known vulnerability (govulncheck; offline database of golang.org/x/vulndb@VULNDB_VERSION, VULNDB=https://vuln.go.dev for the live one).
	@fail=0; for dir in $(GO_MODULES); do \
		pat=; if (cd $$dir && $(GO) list ./... 2>/dev/null | grep -q .); then pat=./...; fi; \
		if grep -qE '^tool[[:space:]]' $$dir/go.mod; then pat="$$pat tool"; fi; \
		echo "govulncheck -db $(VULNDB) $$pat (in $$dir, $$($(GO) env GOVERSION))"; \
		(cd $$dir && $(GO) tool -modfile='$(abspath tools/go.mod)' govulncheck -db '$(VULNDB)' $$pat) || fail=1; \
	done; \
	if [ $$fail = 1 ]; then echo "vulncheck: a module calls a known vulnerability (above): bump the module or the toolchain line of every go.mod"; fi; \
	exit $$fail

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
k8s-rules: ## Regenerate deploy/k8s/components/managed-prometheus/rules.yaml (Managed Prometheus Rules) from deploy/compose/prometheus/alerts.yml; commit it.
	cd deploy && $(GO) run ./cmd/gmprules

.PHONY: rename
rename: ## Give a fork its module path everywhere (imports, go.mod files, protos, gen/, runbook URLs), e.g. make rename MODULE=github.com/acme/orders.
	@if [ -z "$(MODULE)" ]; then echo "usage: make rename MODULE=github.com/acme/orders"; exit 2; fi
	$(GO) run ./cmd/rename -module '$(MODULE)'

# A module of its own, so that River stays out of the main go.mod; `go test ./...` does not reach it. Sizes
# come from LOSSLESS_B3_JOBS / _WORKERS / _ROUNDS / _CONTINUOUS / _RATE (bench/river-compare/bench_test.go),
# e.g. make bench-river LOSSLESS_B3_WORKERS=1000,2000. Like bench-distance, its row, Details and series
# replace B3's in bench/report.md (bench/report -merge); its series land in B3_DATA. About 20 minutes;
# progress: tail -f bench/raw-river.json.
B3_DATA ?= bench/data/b3

.PHONY: bench-river
bench-river: ## B3: pkg/leasequeue vs River v0.51.2, each at its best worker count (100, 1000, 2000), one server, fsync on; merged into bench/report.md.
	@mkdir -p '$(B3_DATA)' && rm -f '$(B3_DATA)'/*.csv bench/raw-river.json
	@status=0; \
	(cd bench/river-compare && LOSSLESS_BENCH_DATA='$(abspath $(B3_DATA))' LOSSLESS_PG_FSYNC=on \
		$(GO) test -json -run '^$$' -bench . -benchtime 1x -timeout 180m .) > bench/raw-river.json || status=1; \
	$(call bench_merge,B3,bench/raw-river.json,$(B3_DATA)); exit $$status

# GKE, from a finished `terraform apply` of deploy/terraform/gcp (docs/deploy-gcp.md). Every value comes from
# `terraform output -json`; the rendered overlay, the manifests and the outputs land in GCP_BUILD, the
# committed overlay stays the example. TAG defaults to the commit (plus a timestamp when the tree is dirty).
# COMPONENTS, when given, keeps only those of the overlay's kustomize components (deploy/k8s/components), e.g.
# COMPONENTS="external-secrets managed-prometheus" for no TLS between the services (docs/deploy-gcp.md).
GCP_TF_DIR ?= deploy/terraform/gcp
GCP_BUILD  ?= $(BIN_DIR)/gcp
ESO_VERSION ?= 1.0.0

# Once per project, before the first terraform apply: deploy/cmd/gcpdeploy/bootstrap-gcp.sh sets gcloud's project,
# then logs in (gcloud and application-default credentials) when needed, enables the APIs, creates the versioned
# state bucket gs://<PROJECT_ID>-tfstate, writes terraform.tfvars from the example and runs terraform init.
# Idempotent. REGION defaults to terraform.tfvars' region.
.PHONY: bootstrap-gcp
bootstrap-gcp: ## Once per project, before terraform apply: gcloud project and logins, APIs, state bucket, terraform.tfvars, terraform init, e.g. make bootstrap-gcp PROJECT_ID=acme-orders-dev.
	PROJECT_ID='$(PROJECT_ID)' TF_DIR='$(GCP_TF_DIR)' $(if $(REGION),REGION='$(REGION)') bash deploy/cmd/gcpdeploy/bootstrap-gcp.sh

.PHONY: deploy-gcp
deploy-gcp: ## Build and push the images, render deploy/k8s/overlays/gcp from terraform output, hand the databases to their users, apply, wait (docs/deploy-gcp.md).
	TF_DIR='$(GCP_TF_DIR)' BUILD='$(GCP_BUILD)' SERVICES='$(SERVICES)' ESO_VERSION='$(ESO_VERSION)' GO='$(GO)' \
		$(if $(TAG),TAG='$(TAG)') $(if $(filter-out undefined,$(origin COMPONENTS)),COMPONENTS='$(COMPONENTS)') \
		bash deploy/cmd/gcpdeploy/deploy-gcp.sh

# The demo as Job demo inside the cluster, with its own identity (deploy/k8s/demo/run.sh): on GKE the
# Kubernetes ServiceAccount demo acts as Terraform's demo client account (Workload Identity), so neither a
# port-forward nor your credentials carry its calls; kubectl and terraform output only find the cluster,
# the namespace, the account and workorder's audience. It deletes the previous Job, applies the new one,
# waits until it completes or fails (at most DEMO_TIMEOUT seconds) and prints its log, the summary. Its image
# is the running workorder's with demo for workorder: make deploy-gcp pushes both.
DEMO_TIMEOUT ?= 720

.PHONY: demo-gcp
demo-gcp: ## Orders against the GKE deployment from Job demo in the cluster (Workload Identity), until they are invoiced; prints its log, e.g. make demo-gcp ARGS="-n 50".
	BUILD='$(GCP_BUILD)/demo' TF_DIR='$(GCP_TF_DIR)' ARGS='$(ARGS)' TIMEOUT='$(DEMO_TIMEOUT)' bash deploy/k8s/demo/run.sh gcp

# The same in the local overlay's cluster (kind, minikube; kubectl's current context), as the local issuer's
# demo client, whose secret deploy/k8s/demo/local/generate-secrets.sh copies from the overlay's; the image
# lossless/demo:local is make images', loaded into the cluster as deploy/k8s/README.md says.
.PHONY: demo-kind
demo-kind: ## Orders against the local overlay (kind, minikube) from Job demo in the cluster, until they are invoiced; prints its log, e.g. make demo-kind ARGS="-n 50".
	BUILD='$(BIN_DIR)/demo-local' ARGS='$(ARGS)' TIMEOUT='$(DEMO_TIMEOUT)' bash deploy/k8s/demo/run.sh local

.PHONY: terraform-fmt
terraform-fmt: ## Fail when `terraform fmt` would change a file of deploy/terraform (terraform on PATH; no provider needed).
	terraform fmt -check -recursive -diff deploy/terraform

# kube-apiserver for deploy/apitest (which applies both Kubernetes overlays server-side to it), built from
# k8s.io/kubernetes through the Go module proxy into .cache/kube-apiserver/<KUBE_VERSION>, once per version
# (and into the machine's cache, ~/.cache/lossless/kube-apiserver, which a fresh clone copies from);
# deploy/apitest finds it there and reads KUBE_VERSION from this line. etcd is Debian's etcd-server.
KUBE_VERSION ?= v1.34.4

.PHONY: kube-apiserver
kube-apiserver: ## Build kube-apiserver KUBE_VERSION into .cache/kube-apiserver/ for deploy/apitest (once per version).
	KUBE_VERSION=$(KUBE_VERSION) deploy/apitest/build-kube-apiserver.sh

.PHONY: apitest
apitest: kube-apiserver ## Apply both Kubernetes overlays server-side to a real kube-apiserver on etcd (deploy/apitest).
	cd deploy && $(GO) test $(GO_TEST_FLAGS) ./apitest/...

# ── images and workflows ─────────────────────────────────────────────────────
# The version .github/workflows' linter runs at, in `make actionlint` and .ci/run.
ACTIONLINT_VERSION ?= v1.7.12

.PHONY: shellcheck
shellcheck: ## Check every shell script (the deploy scripts, the model check, .ci/run) with ShellCheck.
	shellcheck .ci/run $$(git ls-files '*.sh')

.PHONY: actionlint
actionlint: ## Lint every GitHub workflow (.github/workflows) with actionlint (run through the Go module proxy).
	$(GO) run github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

# The images .github/workflows/images.yml builds (one Dockerfile target per service, localissuer's, which
# the local overlay runs, and demo's, the demo Job of deploy/k8s/demo), for this machine's
# platform, tagged as compose runs them (lossless/<service>:local), so `docker compose up` without --build
# uses them. PLATFORMS=linux/amd64,linux/arm64 builds both, as the workflow does (loading a multi-platform
# image needs Docker's containerd image store). ko is not used: the images carry cmd/healthcheck beside the
# service, which a ko image has no place for.
IMAGE_PREFIX ?= lossless
IMAGE_TAG    ?= local

.PHONY: images
images: ## Build every service's image, the local issuer's and the demo's (lossless/<name>:local) with Docker buildx, as the images workflow does; PLATFORMS=... for others.
	@command -v docker >/dev/null 2>&1 || { echo "make images: needs Docker (with buildx) and its engine; none found on PATH. Without Docker, 'make run' runs the system from local binaries."; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make images: docker is installed but its engine does not answer (docker info failed): start the Docker daemon, or check DOCKER_HOST."; exit 1; }
	@docker buildx version >/dev/null 2>&1 || { echo "make images: needs the docker buildx plugin (docker-buildx-plugin)."; exit 1; }
	@for s in $(SERVICES) localissuer demo; do \
		echo "image $(IMAGE_PREFIX)/$$s:$(IMAGE_TAG)"; \
		docker buildx build --load -f deploy/docker/Dockerfile --target $$s $(if $(PLATFORMS),--platform $(PLATFORMS)) \
			-t $(IMAGE_PREFIX)/$$s:$(IMAGE_TAG) . || exit 1; \
	done
