// Package localops implements the make targets that work on the stack `make
// run` started, found through its env file (internal/devtools/runenv): `make psql`,
// `make ops`, `make metrics` and `make trace`. cmd/localops is their command.
package localops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
	"github.com/lossless-dev/lossless/internal/devtools/tracestore"
	"github.com/lossless-dev/lossless/pkg/server"
)

// Command is a program to run (exec) with its whole environment.
type Command struct {
	Path string
	Args []string // without the program name
	Env  []string
}

// service checks that the stack runs svc and returns its database URL ("" for
// none).
func service(env runenv.Env, svc string) (string, error) {
	if svc == "" {
		return "", fmt.Errorf("name a service: SERVICE=<one of %s>", strings.Join(env.Services(), ", "))
	}
	if !slices.Contains(env.Services(), svc) {
		return "", fmt.Errorf("make run runs no service %q; SERVICE is one of %s", svc, strings.Join(env.Services(), ", "))
	}
	return env.Get(runenv.Key(svc, runenv.SuffixDatabaseURL)), nil
}

// PsqlCommand is psql connected to the database of svc; args go to psql.
func PsqlCommand(env runenv.Env, svc string, args []string) (Command, error) {
	dsn, err := service(env, svc)
	if err != nil {
		return Command{}, err
	}
	if dsn == "" {
		return Command{}, fmt.Errorf("%s has no database; services with one: %s", svc, strings.Join(withDatabase(env), ", "))
	}
	psql, err := FindPsql()
	if err != nil {
		return Command{}, err
	}
	return Command{Path: psql, Args: append([]string{dsn}, args...), Env: os.Environ()}, nil
}

// FindPsql looks for psql on $PATH, then in the newest
// /usr/lib/postgresql/<version>/bin (Debian and Ubuntu keep it there, as
// pgtest.StartCluster finds initdb).
func FindPsql() (string, error) {
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if p := filepath.Join(dirs[i], "psql"); executable(p) {
			return p, nil
		}
	}
	return "", errors.New("psql not found on $PATH nor in /usr/lib/postgresql/*/bin: sudo apt-get install -y postgresql-client")
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// OpsCommand is the binary of svc the stack runs, with args, in the
// environment of the stack (the env file's variables, and DATABASE_URL of
// svc's database): the runbooks' commands as written.
func OpsCommand(env runenv.Env, svc string, args []string) (Command, error) {
	dsn, err := service(env, svc)
	if err != nil {
		return Command{}, err
	}
	bin := filepath.Join(env.Get(runenv.KeyBinDir), svc)
	if !executable(bin) {
		return Command{}, fmt.Errorf("%s: the binary of the running stack is missing (%s=%s); restart make run", bin, runenv.KeyBinDir, env.Get(runenv.KeyBinDir))
	}
	e := append(os.Environ(), env.Environ()...)
	if dsn != "" {
		e = append(e, "DATABASE_URL="+dsn)
	}
	// Its calls to other services (billing reconcile -workorder-addr) carry
	// the service's own ID token, not the demo client's: the service's
	// client at the local issuer replaces the env file's.
	if secret := env.Get(runenv.Key(svc, runenv.SuffixClientSecret)); secret != "" {
		e = slices.DeleteFunc(e, func(kv string) bool {
			return strings.HasPrefix(kv, runenv.KeyClientID+"=") || strings.HasPrefix(kv, runenv.KeyClientSecret+"=")
		})
		e = append(e, runenv.KeyClientID+"="+svc, runenv.KeyClientSecret+"="+secret)
	}
	// Its operator commands run as the stack's operator client, verified as
	// the service verifies its operators (ADR 0025), unless the caller
	// brought a credential of their own (serviceapp's OPERATOR_*).
	own := slices.ContainsFunc(e, func(kv string) bool {
		k, v, _ := strings.Cut(kv, "=")
		return v != "" && slices.Contains([]string{"OPERATOR_ID_TOKEN", "OPERATOR_ID_TOKEN_FILE", "OPERATOR_TOKEN_URL", "OPERATOR_BREAK_GLASS"}, k)
	})
	if id, secret := env.Get(runenv.KeyOperatorClientID), env.Get(runenv.KeyOperatorClientSecret); !own && id != "" && secret != "" {
		e = append(e, "OPERATOR_TOKEN_URL="+env.Get(runenv.KeyTokenURL), "OPERATOR_CLIENT_ID="+id, "OPERATOR_CLIENT_SECRET="+secret,
			"AUTH_ISSUER="+env.Get(runenv.KeyIssuer), "AUTH_AUDIENCE="+svc, "AUTH_OPERATORS="+id)
	}
	return Command{Path: bin, Args: args, Env: e}, nil
}

func withDatabase(env runenv.Env) []string {
	var out []string
	for _, s := range env.Services() {
		if env.Get(runenv.Key(s, runenv.SuffixDatabaseURL)) != "" {
			out = append(out, s)
		}
	}
	return out
}

// stallColumn is one column of the metrics table: a Prometheus family
// (docs/observability.md, "Stall indicators"), summed over the series that
// match, or their maximum for ages.
type stallColumn struct {
	header, family string
	match          map[string]string // label values a series must have
	age            bool              // an age in seconds: max, printed as a duration
}

var stallColumns = []stallColumn{
	{header: "OUTBOX OLDEST PENDING", family: "lossless_outbox_events_oldest_pending_age_seconds", age: true},
	{header: "OUTBOX FAILED", family: "lossless_outbox_events_failed"},
	{header: "INBOX OLDEST OPEN", family: "lossless_inbox_oldest_open_age_seconds", age: true},
	{header: "INBOX PARKED", family: "lossless_inbox_parked_entries"},
	{header: "DEAD LETTERS", family: "lossless_pubsub_dead_letter_depth"},
	{header: "DEAD JOBS", family: "lossless_leasequeue_jobs", match: map[string]string{"state": "dead"}},
}

// Metrics scrapes /metrics of every service with a database and writes the
// stall gauges as one table, a row per service. A service that cannot be
// scraped gets a row saying why, and the error is returned after the table.
func Metrics(ctx context.Context, env runenv.Env, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"SERVICE"}
	for _, c := range stallColumns {
		head = append(head, c.header)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	// https:// with `make run TLS=1`: the stack's CA and client certificate.
	clientTLS, err := server.NewTLS(server.TLSConfig{CAFile: env.Get(runenv.KeyTLSCAFile),
		CertFile: env.Get(runenv.KeyTLSCertFile), KeyFile: env.Get(runenv.KeyTLSKeyFile)})
	if err != nil {
		return err
	}
	hc := clientTLS.HTTPClient(0)
	var errs []error
	for _, svc := range withDatabase(env) {
		u := env.Get(runenv.Key(svc, runenv.SuffixAdminURL)) + "/metrics"
		fams, err := scrape(ctx, hc, u)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", svc, err))
			fmt.Fprintf(tw, "%s\tcannot scrape %s\n", svc, u)
			continue
		}
		row := []string{svc}
		for _, c := range stallColumns {
			row = append(row, c.value(fams[c.family]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\n- : the service does not export it (or not yet: gauges are refreshed every 15 s, dead letters every 30 s).")
	fmt.Fprintln(w, "Prometheus names (docs/observability.md):")
	for _, c := range stallColumns {
		name := c.family
		for k, v := range c.match {
			name += fmt.Sprintf("{%s=%q}", k, v)
		}
		fmt.Fprintf(w, "  %-22s %s\n", c.header, name)
	}
	return errors.Join(errs...)
}

func (c stallColumn) value(fam *dto.MetricFamily) string {
	var v float64
	n := 0
	for _, m := range fam.GetMetric() {
		if !labelsMatch(m, c.match) {
			continue
		}
		x := m.GetGauge().GetValue()
		if c.age {
			v = max(v, x)
		} else {
			v += x
		}
		n++
	}
	switch {
	case n == 0:
		return "-"
	case c.age:
		return (time.Duration(v * float64(time.Second))).Round(time.Second).String()
	default:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func scrape(ctx context.Context, hc *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Trace writes the span tree of order id, from the stack's trace store;
// database spans only with queries.
func Trace(ctx context.Context, env runenv.Env, id string, queries bool, w io.Writer) error {
	if id == "" {
		return errors.New("name an order: ORDER=<work order id>")
	}
	base := env.Get(runenv.KeyTraceURL)
	if base == "" {
		return fmt.Errorf("the env file has no %s: a make run from before traces were kept; restart it", runenv.KeyTraceURL)
	}
	o, err := tracestore.Fetch(ctx, base, id)
	if err != nil {
		return err
	}
	return tracestore.WriteTree(w, o, queries)
}

// Caller is the demo client's token configuration of the running stack
// (its env file's AUTH_TOKEN_URL, AUTH_CLIENT_ID, AUTH_CLIENT_SECRET) for
// the service named audience.
func Caller(env runenv.Env, audience string) (clientauth.Config, error) {
	c := clientauth.Config{
		TokenURL: env.Get(runenv.KeyTokenURL), ClientID: env.Get(runenv.KeyClientID),
		ClientSecret: env.Get(runenv.KeyClientSecret), Audience: audience, AudienceVar: "AUDIENCE",
	}
	if c.TokenURL == "" {
		return c, errors.New("the running stack's env file has no " + runenv.KeyTokenURL + ": restart make run")
	}
	return c, c.Validate()
}

// Token writes an ID token of the demo client for audience (default
// "workorder"), for curl and grpcurl.
func Token(ctx context.Context, env runenv.Env, audience string, w io.Writer) error {
	if audience == "" {
		audience = "workorder"
	}
	c, err := Caller(env, audience)
	if err != nil {
		return err
	}
	ts, err := c.TokenSource(ctx)
	if err != nil {
		return err
	}
	tok, err := ts.Token()
	if err != nil {
		return fmt.Errorf("token from %s: %w", c.TokenURL, err)
	}
	_, err = fmt.Fprintln(w, tok.AccessToken)
	return err
}
