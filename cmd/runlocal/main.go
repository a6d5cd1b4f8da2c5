// Command runlocal is `make run`: the whole system as local processes, no
// Docker. The services are those declared under services/ (one
// services/<name>/service.json each, read at start: internal/catalog).
// PostgreSQL comes from the local binaries (or DATABASE_URL), Pub/Sub
// from the emulator we ship (or PUBSUB_EMULATOR_HOST). REPLICAS (default 1)
// starts that many replicas of every service. The operator endpoints are
// guarded by a token generated for this run (or WORKORDER_OPERATOR_TOKEN /
// PROVIDER_OPERATOR_TOKEN), printed in the banner. The services export their
// traces to a store in this process (internal/devtools/tracestore). Once every service
// is ready, the stack's addresses, database URLs and tokens are written to
// .run/env (RUNLOCAL_ENV_FILE overrides the path; internal/devtools/runenv), which
// `make psql`, `make ops`, `make metrics` and `make trace` read. Ctrl-C stops
// every process, removes that file and the ephemeral cluster. TLS=1 (`make
// run TLS=1`) runs TLS between every process, from a CA made for the run
// (localstack.Config.TLS).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
	"github.com/lossless-dev/lossless/internal/devtools/tracestore"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func main() { os.Exit(runMain(localstack.Ports{})) }

// runMain runs the stack on ports (zero values: the defaults) until SIGINT or
// SIGTERM and returns the exit status: 0 for a stop the user asked for, also
// one that comes during start-up, 1 for a failure.
func runMain(ports localstack.Ports) int {
	if err := run(ports); err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		if errors.Is(err, pgtest.ErrNoBinaries) {
			fmt.Fprintln(os.Stderr, "\nInstall PostgreSQL: sudo apt-get install -y postgresql   (or set DATABASE_URL)")
		}
		return 1
	}
	return 0
}

// maxReplicas bounds REPLICAS: each replica is one process per service.
const maxReplicas = catalog.MaxReplicas

func run(ports localstack.Ports) error {
	replicas, err := replicasFromEnv(os.Getenv("REPLICAS"))
	if err != nil {
		return err
	}
	token, extra, err := operatorTokens(os.Getenv("WORKORDER_OPERATOR_TOKEN"), os.Getenv("PROVIDER_OPERATOR_TOKEN"))
	if err != nil {
		return err
	}
	withTLS, err := tlsFromEnv(os.Getenv("TLS"))
	if err != nil {
		return err
	}

	// Run from the repository root, as make does.
	svcs, err := declared.Load(".")
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	binDir, err := os.MkdirTemp("", "lossless-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	fmt.Println("building binaries ...")
	if err := localstack.Build(ctx, ".", binDir); err != nil {
		return stoppedEarly(ctx, err)
	}
	traces, err := tracestore.Start(tracestore.Config{})
	if err != nil {
		return err
	}
	defer func() { _ = traces.Close() }()
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:        binDir,
		Services:      svcs,
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		EmulatorHost:  os.Getenv("PUBSUB_EMULATOR_HOST"),
		ProjectID:     os.Getenv("PUBSUB_PROJECT_ID"),
		Ports:         ports,
		Replicas:      replicas,
		OperatorToken: token,
		ExtraEnv:      extra,
		TraceEndpoint: traces.OTLPEndpoint,
		TraceURL:      traces.URL,
		TLS:           withTLS,
	})
	if err != nil {
		// Start has stopped whatever it had started.
		return stoppedEarly(ctx, err)
	}
	envFile := runenv.Path(os.Getenv)
	if err := runenv.Write(envFile, envVars(stack, os.Getpid(), binDir, traces.URL)); err != nil {
		_ = stack.Stop(30 * time.Second)
		return fmt.Errorf("write %s: %w", envFile, err)
	}
	defer runenv.Remove(envFile, os.Getpid()) //nolint:errcheck // best effort: a stale file is detected by its pid
	fmt.Print(banner(stack, envFile))

	<-ctx.Done()
	fmt.Println("\nstopping ...")
	if err := stack.Stop(30 * time.Second); err != nil {
		return fmt.Errorf("unclean shutdown: %w", err)
	}
	fmt.Println("stopped; nothing left running")
	return nil
}

// stoppedEarly is the outcome of a start-up cut short by err: a Ctrl-C is
// the stop the user asked for, not a failure.
func stoppedEarly(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	fmt.Println("\nstopped; nothing left running")
	return nil
}

// replicasFromEnv parses REPLICAS; empty means 1.
func replicasFromEnv(v string) (int, error) {
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxReplicas {
		return 0, fmt.Errorf("REPLICAS: %q is not a number of replicas within 1..%d", v, maxReplicas)
	}
	return n, nil
}

// tlsFromEnv parses TLS (`make run TLS=1`): empty, 0 or false for
// plaintext, 1 or true for TLS between every process.
func tlsFromEnv(v string) (bool, error) {
	switch v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, fmt.Errorf("TLS: %q: want 1 (TLS between every process) or 0", v)
}

// operatorTokens returns the token every service gets and, when the user set
// a different one for the provider, the environment that keeps it. A token
// the user did not set is generated: the operator endpoints never run open.
func operatorTokens(workorder, provider string) (string, map[string][]string, error) {
	token := workorder
	if token == "" {
		token = provider
	}
	if token == "" {
		t, err := localstack.NewOperatorToken()
		if err != nil {
			return "", nil, err
		}
		token = t
	}
	if provider != "" && provider != token {
		return token, map[string][]string{"provider-sim": {"PROVIDER_OPERATOR_TOKEN=" + provider}}, nil
	}
	return token, nil, nil
}

// envVars are the env file's lines (internal/devtools/runenv documents the keys).
func envVars(stack *localstack.Stack, pid int, binDir, traceURL string) []runenv.Var {
	vars := []runenv.Var{
		{Key: runenv.KeyPID, Value: strconv.Itoa(pid)},
		{Key: runenv.KeyServices, Value: strings.Join(stack.Services().Names(), " ")},
		{Key: runenv.KeyBinDir, Value: binDir},
		{Key: runenv.KeyTraceURL, Value: traceURL},
		{Key: "PUBSUB_EMULATOR_HOST", Value: stack.Emulator},
		{Key: "PUBSUB_PROJECT_ID", Value: stack.ProjectID()},
		{Key: runenv.KeyTokenURL, Value: stack.TokenURL()},
		{Key: runenv.KeyClientID, Value: localstack.DemoClient},
		{Key: runenv.KeyClientSecret, Value: stack.ClientSecret(localstack.DemoClient)},
		{Key: runenv.KeyIssuer, Value: stack.IssuerURL()},
		{Key: runenv.KeyOperatorClientID, Value: localstack.OperatorClient},
		{Key: runenv.KeyOperatorClientSecret, Value: stack.ClientSecret(localstack.OperatorClient)},
	}
	if stack.CA != nil {
		vars = append(vars,
			runenv.Var{Key: runenv.KeyTLSCAFile, Value: stack.CA.CAFile()},
			runenv.Var{Key: runenv.KeyTLSCertFile, Value: stack.ClientCert.CertFile},
			runenv.Var{Key: runenv.KeyTLSKeyFile, Value: stack.ClientCert.KeyFile})
	}
	urls, addrs := stack.URLs(), stack.GRPCAddrs()
	var tokens []string
	for _, svc := range stack.Services() {
		if svc.Database != "" {
			vars = append(vars, runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixDatabaseURL), Value: stack.DSN[svc.Database]})
		}
		vars = append(vars, runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixURL), Value: urls[svc.Name]},
			runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixClientSecret), Value: stack.ClientSecret(svc.Name)})
		if svc.GRPCPort != 0 {
			in := stack.Replicas(svc.Name)[0]
			vars = append(vars, runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixGRPCAddr), Value: addrs[svc.Name]},
				runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixAdminGRPCAddr), Value: in.AdminGRPC},
				runenv.Var{Key: runenv.Key(svc.Name, runenv.SuffixAdminURL), Value: in.AdminURL})
		}
		// The token variables the service reads, as its process got them
		// (a provider token set apart included); later entries win.
		if p := stack.Process(svc.Name); p != nil {
			for _, kv := range p.Env {
				if k, v, ok := strings.Cut(kv, "="); ok && strings.HasSuffix(k, "_OPERATOR_TOKEN") {
					if i := slices.Index(tokens, k); i >= 0 {
						vars = slices.DeleteFunc(vars, func(x runenv.Var) bool { return x.Key == k })
						tokens = slices.Delete(tokens, i, i+1)
					}
					tokens = append(tokens, k)
					vars = append(vars, runenv.Var{Key: k, Value: v})
				}
			}
		}
	}
	return vars
}

func banner(stack *localstack.Stack, envFile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nlossless is running. Ctrl-C stops everything.\n\n")
	api, httpOnly := map[string]string{}, map[string]bool{}
	for _, svc := range stack.Services() {
		api[svc.Name], httpOnly[svc.Name] = svc.RESTPath, svc.GRPCPort == 0
	}
	for _, in := range stack.Instances() {
		if httpOnly[in.Service] {
			// The console: a web page, no gRPC API.
			fmt.Fprintf(&b, "  %-15s open %s%s  (log in with your name and the operator token below)\n", in.ID, in.URL, api[in.Service])
			continue
		}
		fmt.Fprintf(&b, "  %-15s REST %s%-16s gRPC %s   admin gRPC %s   metrics %s/metrics\n", in.ID, in.URL, api[in.Service], in.GRPC, in.AdminGRPC, in.AdminURL)
	}
	fmt.Fprintf(&b, "  Pub/Sub emulator  %s\n", stack.Emulator)
	if stack.CA != nil {
		fmt.Fprintf(&b, `
TLS between every process (TLS=1): the services' gRPC requires a client
certificate of this run's CA; PostgreSQL takes sslmode=verify-full. To call
them from a shell (the env file below holds the same paths):

  export TLS_CA_FILE=%s TLS_CERT_FILE=%s TLS_KEY_FILE=%s
  curl --cacert "$TLS_CA_FILE" --cert "$TLS_CERT_FILE" --key "$TLS_KEY_FILE" %s/readyz
`, stack.CA.CAFile(), stack.ClientCert.CertFile, stack.ClientCert.KeyFile, stack.URLs()["workorder"])
	}
	fmt.Fprintf(&b, `
Operator token of this run (generated unless WORKORDER_OPERATOR_TOKEN or
PROVIDER_OPERATOR_TOKEN is set); the operator endpoints refuse calls
without it:

  export PROVIDER_OPERATOR_TOKEN=%s    # make demo ARGS="-faults ..." reads it
`, stack.OperatorToken)
	// The examples below name the example services; a fork without them
	// gets the list above only.
	urls, addrs := stack.URLs(), stack.GRPCAddrs()
	if u, ok := urls["provider-sim"]; ok {
		fmt.Fprintf(&b, "  curl -H \"authorization: Bearer $PROVIDER_OPERATOR_TOKEN\" -X PUT '%s/v1/faults?authorization.ticket=demo&authorization.actor='\"${USER:-operator}\" -d '{\"duplicate\":0.2}'\n", u)
	}
	if a, ok := addrs["workorder"]; ok {
		if stack.CA != nil {
			fmt.Fprintf(&b, "  grpcurl -cacert \"$TLS_CA_FILE\" -cert \"$TLS_CERT_FILE\" -key \"$TLS_KEY_FILE\" -H \"authorization: Bearer $PROVIDER_OPERATOR_TOKEN\" %s list\n", a)
		} else {
			fmt.Fprintf(&b, "  grpcurl -plaintext -H \"authorization: Bearer $PROVIDER_OPERATOR_TOKEN\" %s list\n", a)
		}
	}
	fmt.Fprintf(&b, `
Database URLs, addresses and tokens of this run are in %s (sourceable:
set -a; . %s; set +a). With the stack running, in another terminal:

  make psql SERVICE=workorder                                   psql on a service's database
  make ops SERVICE=workorder ARGS="inbox list --status PARKED"  a service's command line (runbooks)
  make metrics                                                  the stall gauges of every service
  make trace ORDER=<work order id>                              an order's spans, across its traces
`, envFile, envFile)
	b.WriteString("\n")
	if len(stack.Replicas("provider-sim")) > 1 {
		b.WriteString("Each provider-sim replica has its own fault knobs (make demo sets provider-sim-1's);\nworkorder-k hands off to provider-sim-k.\n\n")
	}
	if wo, ok := urls["workorder"]; ok {
		fmt.Fprintf(&b, "The APIs need an ID token from the local issuer (%s), as client %q:\n", stack.IssuerURL(), localstack.DemoClient)
		fmt.Fprintf(&b, "  TOKEN=$(make -s token)     # for workorder; make -s token AUDIENCE=billing for billing\n\n")
		fmt.Fprintf(&b, "Try:  make demo        (or: curl -H \"authorization: Bearer $TOKEN\" -X POST %s/v1/work-orders -d '{\"customer_id\":\"acme\",\"description\":\"paint\",\"positions\":3,\"unit_price\":{\"currency_code\":\"EUR\",\"minor_units\":1250}}')\n\n", wo)
	}
	return b.String()
}
