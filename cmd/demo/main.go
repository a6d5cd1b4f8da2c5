// Command demo (`make demo`) shows the system working, and doubles as the load
// generator: it creates work orders through the REST API, optionally turns the
// provider's fault knobs on, waits until every order is invoiced (or the wait
// ends), and prints a summary. It talks only to public APIs, so it works
// against `make run` and `docker compose up` alike.
//
//	PROVIDER_OPERATOR_TOKEN=... go run ./cmd/demo -n 200 -faults duplicate=0.2,early_completion=0.2 -ticket INC-7
//	go run ./cmd/demo -rate 50 -duration 5m -json    # open-loop load (B5)
//
// Against services serving TLS, pass https:// URLs and TLS_CA_FILE (and
// TLS_CERT_FILE/TLS_KEY_FILE where a client certificate is wanted).
// Its calls carry an ID token (docs/adr/0017-caller-identity.md): with
// AUTH_TOKEN_URL, AUTH_CLIENT_ID and AUTH_CLIENT_SECRET set, from that
// issuer (compose's local issuer); else from the running `make run`'s
// local issuer, found through its env file (internal/devtools/runenv); else a
// Google ID token of the ambient credentials (in a GKE pod its Workload
// Identity: the Job of make demo-gcp), or with AUTH_IMPERSONATE of a service
// account they may impersonate. WORKORDER_AUDIENCE (default "workorder") is
// the audience. The image lossless/demo runs it as Job demo in a cluster
// (deploy/k8s/demo: make demo-kind, make demo-gcp).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localops"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
)

// callerClient is base sending the demo's ID token for the work-order API:
// from AUTH_TOKEN_URL's issuer when set, else from the running `make run`'s
// (its env file), else Google's.
func callerClient(ctx context.Context, base *http.Client) (*http.Client, error) {
	r := envconfig.New()
	c := clientauth.FromEnv(r, "WORKORDER_AUDIENCE", "workorder")
	if err := r.Err(); err != nil {
		return nil, err
	}
	if c.TokenURL == "" && c.Impersonate == "" && !c.Disabled {
		if env, err := runenv.Load(runenv.Path(os.Getenv)); err == nil {
			if c, err = localops.Caller(env, c.Audience); err != nil {
				return nil, err
			}
		}
	}
	hc, err := c.HTTPClient(context.WithoutCancel(ctx), base)
	if err != nil {
		return nil, fmt.Errorf("ID token for the work-order API (start make run, or set AUTH_TOKEN_URL, AUTH_CLIENT_ID, AUTH_CLIENT_SECRET): %w", err)
	}
	return hc, nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var (
		workorder = fs.String("workorder-url", envOr("WORKORDER_URL", "http://127.0.0.1:8080"), "work-order REST base URL")
		woAdmin   = fs.String("workorder-admin-url", envOr("WORKORDER_ADMIN_URL", "http://127.0.0.1:8180"), "work-order admin HTTP base URL (its /metrics)")
		// PROVIDER_SIM_ADMIN_URL: the key a sourced .run/env of make run sets.
		provider    = fs.String("provider-admin-url", envOr("PROVIDER_ADMIN_URL", envOr("PROVIDER_SIM_ADMIN_URL", "http://127.0.0.1:8181")), "provider-sim admin HTTP base URL (fault knobs)")
		n           = fs.Int("n", 100, "number of orders (closed loop)")
		rate        = fs.Float64("rate", 0, "offered load in orders/s (open loop; 0 = closed loop with -n)")
		duration    = fs.Duration("duration", 10*time.Second, "open-loop duration")
		concurrency = fs.Int("concurrency", 16, "in-flight create requests")
		wait        = fs.Duration("wait", 2*time.Minute, "how long to wait for orders to be invoiced")
		faults      = fs.String("faults", "", "provider fault knobs, e.g. duplicate=0.2,early_completion=0.2,split_completion=0.1,poison=0.05,unknown_order=0.05")
		token       = fs.String("provider-token", os.Getenv("PROVIDER_OPERATOR_TOKEN"), "provider-sim operator token, needed by -faults (default $PROVIDER_OPERATOR_TOKEN)")
		ticket      = fs.String("ticket", "demo", "ticket the -faults change is recorded under in provider-sim's audit (actor "+demoActor+")")
		asJSON      = fs.Bool("json", false, "print the result as JSON")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// https:// URLs are verified with TLS_CA_FILE, presenting
	// TLS_CERT_FILE/TLS_KEY_FILE when set (`make run TLS=1` prints them).
	clientTLS, err := libenv.NewTLS(envconfig.New())
	if err != nil {
		return err
	}
	hc := clientTLS.HTTPClient(10 * time.Second)
	// The work-order calls carry the demo's ID token; the provider's knobs
	// take the operator token instead (hc).
	caller, err := callerClient(ctx, hc)
	if err != nil {
		return err
	}

	if *faults != "" {
		knobs, err := parseFaults(*faults)
		if err != nil {
			return err
		}
		if *token == "" {
			return errors.New("-faults needs the provider's operator token: set PROVIDER_OPERATOR_TOKEN or -provider-token")
		}
		if err := putFaults(ctx, hc, *provider, *token, *ticket, knobs); err != nil {
			return fmt.Errorf("set provider faults: %w", err)
		}
		fmt.Fprintf(stderr, "provider faults on: %s\n", *faults)
	}
	progress := stderr
	if *asJSON {
		progress = nil
	}
	res, err := loadgen.Run(ctx, loadgen.Config{
		BaseURL: *workorder, Count: *n, Rate: *rate, Duration: *duration,
		Concurrency: *concurrency, Wait: *wait, Progress: progress, HTTP: caller,
	})
	if err != nil {
		return err
	}
	inbox, _ := loadgen.Scrape(ctx, hc, *woAdmin+"/metrics",
		// parked entries by reason; received by outcome (duplicate = absorbed); open payload conflicts.
		"lossless_inbox_parked_entries", "lossless_inbox_received_total", "lossless_inbox_open_conflicts")
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			*loadgen.Result
			Inbox map[string]float64 `json:"inbox_metrics"`
		}{res, inbox})
	}
	printSummary(stdout, res, inbox)
	if res.Invoiced+res.ByStatus["WORK_ORDER_STATUS_CANCELLED"] < res.Created {
		return errors.New("not every order was invoiced within the wait; see the parked entries (docs/runbooks/repair-parked-inbox-entries.md)")
	}
	return nil
}

func printSummary(w io.Writer, r *loadgen.Result, inbox map[string]float64) {
	fmt.Fprintf(w, "\norders created: %d (create errors: %d), elapsed %s\n", r.Created, r.CreateErrors, r.Elapsed)
	fmt.Fprintln(w, "orders by status:")
	for _, k := range sortedKeys(r.ByStatus) {
		fmt.Fprintf(w, "  %-32s %d\n", strings.TrimPrefix(k, "WORK_ORDER_STATUS_"), r.ByStatus[k])
	}
	fmt.Fprintf(w, "invoices: %d\n", r.Invoiced)
	fmt.Fprintln(w, "inbox (from workorder /metrics):")
	keys := make([]string, 0, len(inbox))
	for k := range inbox {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-60s %g\n", k, inbox[k])
	}
	fmt.Fprintf(w, "create→invoiced latency: p50 %s  p95 %s  p99 %s  max %s\n", r.LatencyP50, r.LatencyP95, r.LatencyP99, r.LatencyMax)
	fmt.Fprintf(w, "throughput: %.1f orders/s created, %.1f invoiced/s\n", r.AchievedRate, r.InvoicedPerSec)
}

func parseFaults(s string) (map[string]any, error) {
	knobs := map[string]any{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("fault %q: want name=value", kv)
		}
		if k == "extra_delay" {
			knobs[k] = v
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("fault %s: %q is not a number", k, v)
		}
		knobs[k] = f
	}
	return knobs, nil
}

// demoActor is who provider-sim's audit says changed the knobs.
const demoActor = "demo"

// putFaults replaces the provider's knobs (PUT /v1/faults): the knobs are
// the body, the audit's ticket and actor query parameters.
func putFaults(ctx context.Context, hc *http.Client, base, token, ticket string, knobs map[string]any) error {
	body, _ := json.Marshal(knobs)
	auth := url.Values{"authorization.ticket": {ticket}, "authorization.actor": {demoActor}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/faults?"+auth.Encode(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
