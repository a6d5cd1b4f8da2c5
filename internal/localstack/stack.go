// Package localstack runs the whole system as separate local processes, the
// way `make run` does and the end-to-end test does: PostgreSQL (an ephemeral
// cluster, or DATABASE_URL), the Pub/Sub emulator we ship (or
// PUBSUB_EMULATOR_HOST), provisioning, migrations, then provider-sim,
// workorder and billing, each with its own database and ports, each in as
// many replicas as Config.Replicas asks for.
package localstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/freeport"
	"github.com/lossless-dev/lossless/pkg/pgcluster"
)

// Binaries built for the stack, as `make build` names them.
var binaries = []struct{ name, pkg string }{
	{"workorder", "./services/workorder"},
	{"provider-sim", "./services/provider-sim"},
	{"billing", "./services/billing"},
	{"pubsub-emulator", "./cmd/pubsub-emulator"},
}

// Ports of one stack. Zero values take the documented defaults. The
// service ports are those of replica 1.
type Ports struct {
	Emulator      int // default 8085
	WorkOrderGRPC int // default 9090
	WorkOrderHTTP int // default 8080
	ProviderGRPC  int // default 9091
	ProviderHTTP  int // default 8081
	BillingGRPC   int // default 9092
	BillingHTTP   int // default 8082
	// More holds the ports of replicas 2, 3, ... in order. A replica without
	// an entry, or a zero port in it, listens on replica 1's port plus
	// ReplicaPortStep × (replica − 1): with the defaults workorder-2 serves
	// gRPC on 9100 and REST on 8090, provider-sim-2 9101/8091, billing-2
	// 9102/8092.
	More []ReplicaPorts
}

// ReplicaPorts are the ports of one replica of every service.
type ReplicaPorts struct {
	WorkOrderGRPC, WorkOrderHTTP int
	ProviderGRPC, ProviderHTTP   int
	BillingGRPC, BillingHTTP     int
}

// ReplicaPortStep separates the default ports of consecutive replicas.
const ReplicaPortStep = 10

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

// replica returns the ports of replica k (1-based) of every service.
func (p *Ports) replica(k int) ReplicaPorts {
	first := ReplicaPorts{p.WorkOrderGRPC, p.WorkOrderHTTP, p.ProviderGRPC, p.ProviderHTTP, p.BillingGRPC, p.BillingHTTP}
	if k == 1 {
		return first
	}
	var r ReplicaPorts
	if k-2 < len(p.More) {
		r = p.More[k-2]
	}
	off := ReplicaPortStep * (k - 1)
	def := func(v *int, base int) {
		if *v == 0 {
			*v = base + off
		}
	}
	def(&r.WorkOrderGRPC, first.WorkOrderGRPC)
	def(&r.WorkOrderHTTP, first.WorkOrderHTTP)
	def(&r.ProviderGRPC, first.ProviderGRPC)
	def(&r.ProviderHTTP, first.ProviderHTTP)
	def(&r.BillingGRPC, first.BillingGRPC)
	def(&r.BillingHTTP, first.BillingHTTP)
	return r
}

// FreePorts returns a Ports with every port of a one-replica stack free on
// loopback (for tests).
func FreePorts() (Ports, error) { return FreePortsFor(1) }

// FreePortsFor returns a Ports with every port of a stack of replicas
// replicas free on loopback (for tests).
func FreePortsFor(replicas int) (Ports, error) {
	if replicas < 1 {
		return Ports{}, errors.New("localstack: FreePortsFor needs at least one replica")
	}
	ps, err := freeport.Get(1 + 6*replicas)
	if err != nil {
		return Ports{}, err
	}
	p := Ports{Emulator: ps[0], WorkOrderGRPC: ps[1], WorkOrderHTTP: ps[2], ProviderGRPC: ps[3], ProviderHTTP: ps[4], BillingGRPC: ps[5], BillingHTTP: ps[6]}
	for k := 1; k < replicas; k++ {
		q := ps[1+6*k:]
		p.More = append(p.More, ReplicaPorts{q[0], q[1], q[2], q[3], q[4], q[5]})
	}
	return p, nil
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
	// Fsync starts the ephemeral cluster with fsync=on (benchmarks; see
	// pgtest.EnvFsync). Default false. Ignored with DatabaseURL.
	Fsync bool
	// EmulatorHost of an existing Pub/Sub emulator. Default "": start ours.
	EmulatorHost string
	// ProjectID of the Pub/Sub project. Default "lossless-local".
	ProjectID string
	// Ports of the services. Zero values take the defaults.
	Ports Ports
	// Replicas of each service (workorder, provider-sim, billing). Default 1.
	// Replicas of a service share its database and Pub/Sub subscriptions;
	// each has its own ports (see Ports.More) and instance id
	// ("<service>-<k>": env INSTANCE_ID, OTEL service.instance.id, the outbox
	// relay id and the prefix of its log lines). Workorder replica k hands
	// off to provider-sim replica ((k−1) mod Replicas)+1: PROVIDER_ADDR takes
	// one address, and any workorder replica's relay dispatches any pending
	// hand-off, so a killed provider replica delays, never strands, orders.
	Replicas int
	// OperatorToken guards the operator endpoints of every service
	// (WORKORDER_OPERATOR_TOKEN, PROVIDER_OPERATOR_TOKEN). Default: 32 random
	// bytes, hex-encoded, new for each stack: the endpoints fail closed and
	// only whoever started the stack can use them (Stack.OperatorToken).
	OperatorToken string
	// ExtraEnv is added to every service's environment per service name, for
	// every replica (e.g. provider fault knobs: {"provider-sim":
	// {"PROVIDER_FAULT_DUPLICATE=0.2"}}), then per instance id
	// ({"billing-2": {...}}), which wins.
	ExtraEnv map[string][]string
	// Log receives every process's output, each line prefixed with its name.
	// Default os.Stdout.
	Log io.Writer
	// ReadyTimeout bounds each service's start-up. Default 60s.
	ReadyTimeout time.Duration
}

// Stack is a running local system.
type Stack struct {
	cfg       Config
	cluster   *pgcluster.Cluster
	logMu     sync.Mutex
	procs     map[string]*Process // by instance id; a service name names replica 1
	order     []string            // instance ids in start order
	instances []Instance
	DSN       map[string]string // database name (workorder, billing, providersim) -> URL
	Emulator  string            // host:port
	// OperatorToken is the bearer token of every service's operator
	// endpoints (Config.OperatorToken, or the one generated).
	OperatorToken string
}

// Instance is one replica of a service.
type Instance struct {
	ID      string // "<service>-<replica>", e.g. "workorder-2"
	Service string // workorder, provider-sim or billing
	Replica int    // 1-based
	GRPC    string // host:port
	URL     string // REST base URL, also /healthz, /readyz, /metrics
}

// services in start order: the provider first (workorder hands off to it),
// billing last (it consumes what workorder publishes).
var services = []string{"provider-sim", "workorder", "billing"}

// NewOperatorToken returns 32 random bytes, hex-encoded.
func NewOperatorToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("localstack: operator token: %w", err)
	}
	return hex.EncodeToString(b), nil
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
		tok, err := NewOperatorToken()
		if err != nil {
			return nil, err
		}
		cfg.OperatorToken = tok
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 0 || cfg.Replicas > 20 {
		return nil, fmt.Errorf("localstack: Replicas %d: want 1..20", cfg.Replicas)
	}
	if cfg.Log == nil {
		cfg.Log = os.Stdout
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	cfg.Ports.setDefaults()
	s := &Stack{cfg: cfg, procs: map[string]*Process{}, DSN: map[string]string{}, OperatorToken: cfg.OperatorToken}
	defer func() {
		if err != nil {
			_ = s.Stop(10 * time.Second)
		}
	}()

	server := cfg.DatabaseURL
	if server == "" {
		s.logf("postgres", "starting an ephemeral PostgreSQL cluster from the local binaries")
		s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{Fsync: cfg.Fsync})
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
		em := s.add("pubsub-emulator", "pubsub-emulator", nil, "PUBSUB_EMULATOR_LISTEN="+s.Emulator)
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

	// Every service reads its listen addresses from GRPC_ADDR and HTTP_ADDR.
	for _, svc := range services {
		for k := 1; k <= cfg.Replicas; k++ {
			in := s.instance(svc, k)
			env := []string{
				"GRPC_ADDR=" + in.GRPC,
				"HTTP_ADDR=" + strings.TrimPrefix(in.URL, "http://"),
				"INSTANCE_ID=" + in.ID,
				"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" + in.ID,
			}
			switch svc {
			case "workorder":
				provider := s.instance("provider-sim", (k-1)%cfg.Replicas+1)
				env = append(env, "PROVIDER_ADDR="+provider.GRPC,
					"WORKORDER_OUTBOX_RELAY_ID="+in.ID,
					"WORKORDER_OPERATOR_TOKEN="+cfg.OperatorToken)
			case "provider-sim":
				env = append(env, "PROVIDER_OPERATOR_TOKEN="+cfg.OperatorToken)
			case "billing":
				env = append(env, "BILLING_OUTBOX_RELAY_ID="+in.ID)
			}
			p := s.add(in.ID, svc, []string{"serve"}, env...)
			p.Supervise = true
			if k == 1 {
				s.procs[svc] = p
			}
			s.instances = append(s.instances, in)
		}
	}
	// Replicas of one service start together; readiness is awaited before
	// the next service, so a consumer never starts ahead of its producer.
	for _, svc := range services {
		for _, in := range s.instances {
			if in.Service == svc {
				if err := s.procs[in.ID].Start(); err != nil {
					return nil, err
				}
			}
		}
		for _, in := range s.instances {
			if in.Service == svc {
				if err := s.WaitReady(ctx, in.ID); err != nil {
					return nil, err
				}
			}
		}
	}
	return s, nil
}

// instance describes replica k of svc.
func (s *Stack) instance(svc string, k int) Instance {
	r := s.cfg.Ports.replica(k)
	grpcPort, httpPort := r.WorkOrderGRPC, r.WorkOrderHTTP
	switch svc {
	case "provider-sim":
		grpcPort, httpPort = r.ProviderGRPC, r.ProviderHTTP
	case "billing":
		grpcPort, httpPort = r.BillingGRPC, r.BillingHTTP
	}
	return Instance{
		ID:      fmt.Sprintf("%s-%d", svc, k),
		Service: svc,
		Replica: k,
		GRPC:    fmt.Sprintf("127.0.0.1:%d", grpcPort),
		URL:     fmt.Sprintf("http://127.0.0.1:%d", httpPort),
	}
}

// Instances lists every replica of every service, in start order.
func (s *Stack) Instances() []Instance { return slices.Clone(s.instances) }

// Replicas returns the replicas of svc, replica 1 first.
func (s *Stack) Replicas(svc string) []Instance {
	var out []Instance
	for _, in := range s.instances {
		if in.Service == svc {
			out = append(out, in)
		}
	}
	return out
}

// URLs are the HTTP base URLs of the services' replica 1.
func (s *Stack) URLs() map[string]string {
	out := map[string]string{}
	for _, in := range s.instances {
		if in.Replica == 1 {
			out[in.Service] = in.URL
		}
	}
	return out
}

// GRPCAddrs are the gRPC addresses of the services' replica 1.
func (s *Stack) GRPCAddrs() map[string]string {
	out := map[string]string{}
	for _, in := range s.instances {
		if in.Replica == 1 {
			out[in.Service] = in.GRPC
		}
	}
	return out
}

// RestartPostgres crashes the stack's own PostgreSQL cluster (pg_ctl stop
// -m immediate: every connection cut, no shutdown checkpoint) and starts it
// again, which runs crash recovery. It needs the ephemeral cluster: a stack
// on DatabaseURL does not own its server.
func (s *Stack) RestartPostgres(ctx context.Context) error {
	if s.cluster == nil {
		return errors.New("localstack: RestartPostgres needs the stack's own cluster (DatabaseURL empty)")
	}
	s.logf("postgres", "crash (pg_ctl stop -m immediate) and restart")
	if err := s.cluster.Crash(ctx); err != nil {
		return err
	}
	if err := s.cluster.Restart(ctx); err != nil {
		return err
	}
	s.logf("postgres", "back, listening on 127.0.0.1:%d", s.cluster.Port())
	return nil
}

// Process returns a long-running process (for fault injection) by instance
// id ("billing-2"); a service name ("billing") names its replica 1.
func (s *Stack) Process(name string) *Process { return s.procs[name] }

// WaitReady polls /readyz of an instance ("billing-2", or "billing" for
// replica 1) until it answers 200.
func (s *Stack) WaitReady(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	p := s.procs[name]
	if p == nil {
		return fmt.Errorf("localstack: no instance %q", name)
	}
	var u string
	for _, in := range s.instances {
		if in.ID == p.Name {
			u = in.URL + "/readyz"
		}
	}
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited during start-up: %w", name, err)
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
			return fmt.Errorf("%s not ready at %s: %w", name, u, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops services in reverse start order with SIGTERM (each bounded by
// timeout), then the emulator and the ephemeral cluster. It returns the
// services' exit errors: a non-zero exit after SIGTERM is a failed graceful
// shutdown.
func (s *Stack) Stop(timeout time.Duration) error {
	err := s.stop(timeout, false)
	if s.cluster != nil {
		s.cluster.Remove()
		s.logf("postgres", "stopped and removed")
	}
	return err
}

// StopServices stops the services like Stop, but leaves the emulator and
// PostgreSQL running, so a test can inspect what the shutdown left behind.
// Stop still has to be called.
func (s *Stack) StopServices(timeout time.Duration) error { return s.stop(timeout, true) }

func (s *Stack) stop(timeout time.Duration, servicesOnly bool) error {
	var errs []error
	for i := len(s.order) - 1; i >= 0; i-- {
		if servicesOnly && s.order[i] == "pubsub-emulator" {
			continue
		}
		if err := s.procs[s.order[i]].Stop(timeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// add registers a process named name running binary (a service's).
func (s *Stack) add(name, binary string, args []string, env ...string) *Process {
	svcEnv := []string{
		"PUBSUB_EMULATOR_HOST=" + s.Emulator,
		"PUBSUB_PROJECT_ID=" + s.cfg.ProjectID,
	}
	switch binary {
	case "workorder", "billing":
		svcEnv = append(svcEnv, "DATABASE_URL="+s.DSN[binary])
	case "provider-sim":
		svcEnv = append(svcEnv, "DATABASE_URL="+s.DSN["providersim"])
	}
	// Later entries win: the caller's ExtraEnv overrides the stack's choices.
	svcEnv = append(append(append(svcEnv, env...), s.cfg.ExtraEnv[binary]...), s.cfg.ExtraEnv[name]...)
	p := &Process{
		Name: name,
		Path: filepath.Join(s.cfg.BinDir, binary),
		Args: args,
		Env:  svcEnv,
		out:  &prefixWriter{mu: &s.logMu, out: s.cfg.Log, prefix: fmt.Sprintf("%-16s| ", name)},
	}
	s.procs[name] = p
	s.order = append(s.order, name)
	return p
}

func (s *Stack) oneShot(ctx context.Context, label, binary string, args ...string) error {
	p := s.add(label, binary, args)
	// One-shot jobs are not part of the long-running set.
	delete(s.procs, label)
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
