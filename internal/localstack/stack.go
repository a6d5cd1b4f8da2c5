// Package localstack runs the whole system as separate local processes, the
// way `make run` does and the end-to-end test does: PostgreSQL (an ephemeral
// cluster, or DATABASE_URL), the Pub/Sub emulator we ship (or
// PUBSUB_EMULATOR_HOST), provisioning, migrations, then provider-sim,
// workorder and billing, each with its own database and ports.
package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgcluster"
)

// Binaries built for the stack, as `make build` names them.
var binaries = []struct{ name, pkg string }{
	{"workorder", "./services/workorder"},
	{"provider-sim", "./services/provider-sim"},
	{"billing", "./services/billing"},
	{"pubsub-emulator", "./cmd/pubsub-emulator"},
}

// Ports of one stack. Zero values take the documented defaults.
type Ports struct {
	Emulator      int // default 8085
	WorkOrderGRPC int // default 9090
	WorkOrderHTTP int // default 8080
	ProviderGRPC  int // default 9091
	ProviderHTTP  int // default 8081
	BillingGRPC   int // default 9092
	BillingHTTP   int // default 8082
}

func (p *Ports) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.Emulator, 8085)
	def(&p.WorkOrderGRPC, 9090)
	def(&p.WorkOrderHTTP, 8080)
	def(&p.ProviderGRPC, 9091)
	def(&p.ProviderHTTP, 8081)
	def(&p.BillingGRPC, 9092)
	def(&p.BillingHTTP, 8082)
}

// FreePorts returns a Ports with every port free on loopback (for tests).
func FreePorts() (Ports, error) {
	var ps [7]int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for i := range ps {
		var lc net.ListenConfig
		l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			return Ports{}, err
		}
		ls = append(ls, l)
		ps[i] = l.Addr().(*net.TCPAddr).Port
	}
	return Ports{ps[0], ps[1], ps[2], ps[3], ps[4], ps[5], ps[6]}, nil
}

// Config of a local stack.
type Config struct {
	// BinDir holds the binaries (see Build). Required.
	BinDir string
	// DatabaseURL of an existing server (any database on it); the stack
	// creates its databases there. Default "": start an ephemeral cluster.
	DatabaseURL string
	// DatabasePrefix is prepended to the database names (workorder, billing,
	// providersim), so several stacks can share a server. Default "".
	DatabasePrefix string
	// EmulatorHost of an existing Pub/Sub emulator. Default "": start ours.
	EmulatorHost string
	// ProjectID of the Pub/Sub project. Default "lossless-local".
	ProjectID string
	// Ports of the services. Zero values take the defaults.
	Ports Ports
	// OperatorToken for the work-order admin API. Default "local-operator-token".
	OperatorToken string
	// ExtraEnv is added to every service's environment per service name
	// (e.g. provider fault knobs: {"provider-sim": {"PROVIDER_FAULT_DUPLICATE=0.2"}}).
	ExtraEnv map[string][]string
	// Log receives every process's output, each line prefixed with its name.
	// Default os.Stdout.
	Log io.Writer
	// ReadyTimeout bounds each service's start-up. Default 60s.
	ReadyTimeout time.Duration
}

// Stack is a running local system.
type Stack struct {
	cfg      Config
	cluster  *pgcluster.Cluster
	logMu    sync.Mutex
	procs    map[string]*Process
	order    []string
	DSN      map[string]string // service name -> database URL
	Emulator string            // host:port
}

// Build compiles the stack's binaries into dir (static, like `make build`).
func Build(ctx context.Context, repoRoot, dir string) error {
	for _, b := range binaries {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(dir, b.name), b.pkg)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", b.name, err, out)
		}
	}
	return nil
}

// Start brings the stack up in dependency order and returns when every
// service is ready. On error, whatever started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	if cfg.BinDir == "" {
		return nil, errors.New("localstack: BinDir is required")
	}
	if cfg.ProjectID == "" {
		cfg.ProjectID = "lossless-local"
	}
	if cfg.OperatorToken == "" {
		cfg.OperatorToken = "local-operator-token"
	}
	if cfg.Log == nil {
		cfg.Log = os.Stdout
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	cfg.Ports.setDefaults()
	s := &Stack{cfg: cfg, procs: map[string]*Process{}, DSN: map[string]string{}}
	defer func() {
		if err != nil {
			_ = s.Stop(10 * time.Second)
		}
	}()

	server := cfg.DatabaseURL
	if server == "" {
		s.logf("postgres", "starting an ephemeral PostgreSQL cluster from the local binaries")
		s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return nil, err
		}
		server = s.cluster.DSN("postgres")
		s.logf("postgres", "listening on 127.0.0.1:%d", s.cluster.Port())
	}
	for _, db := range []string{"workorder", "billing", "providersim"} {
		if s.DSN[db], err = ensureDatabase(ctx, server, cfg.DatabasePrefix+db); err != nil {
			return nil, err
		}
	}

	s.Emulator = cfg.EmulatorHost
	if s.Emulator == "" {
		s.Emulator = fmt.Sprintf("127.0.0.1:%d", cfg.Ports.Emulator)
		em := s.add("pubsub-emulator", nil, "PUBSUB_EMULATOR_LISTEN="+s.Emulator)
		if err := em.Start(); err != nil {
			return nil, err
		}
		if err := waitTCP(ctx, s.Emulator, cfg.ReadyTimeout); err != nil {
			return nil, fmt.Errorf("pubsub-emulator: %w", err)
		}
	}

	// One-shot jobs: provisioning (any service binary offers it), migrations.
	if err := s.oneShot(ctx, "provision", "workorder", "provision"); err != nil {
		return nil, err
	}
	for _, svc := range []string{"workorder", "provider-sim", "billing"} {
		if err := s.oneShot(ctx, "migrate-"+svc, svc, "migrate"); err != nil {
			return nil, err
		}
	}

	p := cfg.Ports
	// Every service reads its listen addresses from GRPC_ADDR and HTTP_ADDR.
	s.add("provider-sim", []string{"serve"},
		fmt.Sprintf("GRPC_ADDR=127.0.0.1:%d", p.ProviderGRPC),
		fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", p.ProviderHTTP))
	s.add("workorder", []string{"serve"},
		fmt.Sprintf("GRPC_ADDR=127.0.0.1:%d", p.WorkOrderGRPC),
		fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", p.WorkOrderHTTP),
		fmt.Sprintf("PROVIDER_ADDR=127.0.0.1:%d", p.ProviderGRPC),
		"WORKORDER_OPERATOR_TOKEN="+cfg.OperatorToken)
	s.add("billing", []string{"serve"},
		fmt.Sprintf("GRPC_ADDR=127.0.0.1:%d", p.BillingGRPC),
		fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", p.BillingHTTP))
	for _, svc := range []string{"provider-sim", "workorder", "billing"} {
		s.procs[svc].Supervise = true
		if err := s.procs[svc].Start(); err != nil {
			return nil, err
		}
		if err := s.WaitReady(ctx, svc); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// URLs are the HTTP base URLs of the services.
func (s *Stack) URLs() map[string]string {
	p := s.cfg.Ports
	return map[string]string{
		"workorder":    fmt.Sprintf("http://127.0.0.1:%d", p.WorkOrderHTTP),
		"provider-sim": fmt.Sprintf("http://127.0.0.1:%d", p.ProviderHTTP),
		"billing":      fmt.Sprintf("http://127.0.0.1:%d", p.BillingHTTP),
	}
}

// GRPCAddrs are the gRPC addresses of the services.
func (s *Stack) GRPCAddrs() map[string]string {
	p := s.cfg.Ports
	return map[string]string{
		"workorder":    fmt.Sprintf("127.0.0.1:%d", p.WorkOrderGRPC),
		"provider-sim": fmt.Sprintf("127.0.0.1:%d", p.ProviderGRPC),
		"billing":      fmt.Sprintf("127.0.0.1:%d", p.BillingGRPC),
	}
}

// Process returns a long-running process by name (for fault injection).
func (s *Stack) Process(name string) *Process { return s.procs[name] }

// WaitReady polls a service's /readyz until it answers 200.
func (s *Stack) WaitReady(ctx context.Context, svc string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	u := s.URLs()[svc] + "/readyz"
	for {
		if exited, err := s.procs[svc].Exited(); exited {
			return fmt.Errorf("%s exited during start-up: %w", svc, err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w", svc, u, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops services in reverse start order with SIGTERM (each bounded by
// timeout), then the emulator and the ephemeral cluster. It returns the
// services' exit errors: a non-zero exit after SIGTERM is a failed graceful
// shutdown.
func (s *Stack) Stop(timeout time.Duration) error {
	var errs []error
	for i := len(s.order) - 1; i >= 0; i-- {
		if err := s.procs[s.order[i]].Stop(timeout); err != nil {
			errs = append(errs, err)
		}
	}
	if s.cluster != nil {
		s.cluster.Remove()
		s.logf("postgres", "stopped and removed")
	}
	return errors.Join(errs...)
}

func (s *Stack) add(name string, args []string, env ...string) *Process {
	svcEnv := []string{
		"PUBSUB_EMULATOR_HOST=" + s.Emulator,
		"PUBSUB_PROJECT_ID=" + s.cfg.ProjectID,
	}
	switch name {
	case "workorder", "billing":
		svcEnv = append(svcEnv, "DATABASE_URL="+s.DSN[name])
	case "provider-sim":
		svcEnv = append(svcEnv, "DATABASE_URL="+s.DSN["providersim"])
	}
	svcEnv = append(svcEnv, s.cfg.ExtraEnv[name]...)
	p := &Process{
		Name: name,
		Path: filepath.Join(s.cfg.BinDir, name),
		Args: args,
		Env:  append(svcEnv, env...),
		out:  &prefixWriter{mu: &s.logMu, out: s.cfg.Log, prefix: fmt.Sprintf("%-16s| ", name)},
	}
	s.procs[name] = p
	s.order = append(s.order, name)
	return p
}

func (s *Stack) oneShot(ctx context.Context, label, binary string, args ...string) error {
	p := s.add(binary, args)
	p.Name = label
	p.out.prefix = fmt.Sprintf("%-16s| ", label)
	// One-shot jobs are not part of the long-running set.
	delete(s.procs, binary)
	s.order = s.order[:len(s.order)-1]
	if err := p.Run(ctx); err != nil {
		return fmt.Errorf("%s failed: %w", label, err)
	}
	return nil
}

func (s *Stack) logf(name, format string, args ...any) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	fmt.Fprintf(s.cfg.Log, "%-16s| %s\n", name, fmt.Sprintf(format, args...))
}

// ensureDatabase creates db on the server at serverURL if missing and returns its URL.
func ensureDatabase(ctx context.Context, serverURL, db string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL at %s: %w", redact(serverURL), err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			return "", fmt.Errorf("create database %s: %w", db, err)
		}
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + db
	return u.String(), nil
}

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not reachable: %w", addr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
