// Package localstack runs the whole system as separate local processes, the
// way `make run` does and the end-to-end test does: PostgreSQL (an ephemeral
// cluster, or DATABASE_URL), the Pub/Sub emulator we ship (or
// PUBSUB_EMULATOR_HOST), provisioning, migrations, then every service the
// catalog declares (services/<name>/service.json, in start order), each with
// its own database and ports, each in as many replicas as Config.Replicas
// asks for.
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
	"google.golang.org/grpc"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/internal/devtools/localca"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
)

// ServicePorts are the listeners of one replica of a service: the public
// ones and the admin ones (operator services, /metrics; none for a service
// without gRPC).
type ServicePorts struct{ GRPC, HTTP, AdminGRPC, AdminHTTP int }

// Ports of one stack. Zero values take the defaults.
type Ports struct {
	Emulator int // default 8085
	Issuer   int // the local OIDC issuer; default 8086
	// Services holds, per service name, the ports of its replicas 1, 2, ...
	// in order. A replica without an entry, or a zero port in it, listens on
	// the port its declaration names plus ReplicaPortStep × (replica − 1):
	// with the declared ports workorder-1 serves gRPC on 9090 and REST on
	// 8080, workorder-2 on 9100 and 8090.
	Services map[string][]ServicePorts
}

// ReplicaPortStep separates the default ports of consecutive replicas.
const ReplicaPortStep = catalog.ReplicaPortStep

// replica returns the ports of replica k (1-based) of svc.
func (p Ports) replica(svc catalog.Service, k int) ServicePorts {
	var r ServicePorts
	if list := p.Services[svc.Name]; k-1 < len(list) {
		r = list[k-1]
	}
	off := ReplicaPortStep * (k - 1)
	if r.GRPC == 0 {
		r.GRPC = svc.GRPCPort + off
	}
	if r.HTTP == 0 {
		r.HTTP = svc.HTTPPort + off
	}
	if svc.GRPCPort == 0 {
		r.AdminGRPC, r.AdminHTTP = 0, 0
		return r
	}
	if r.AdminGRPC == 0 {
		r.AdminGRPC = svc.AdminGRPCPort() + off
	}
	if r.AdminHTTP == 0 {
		r.AdminHTTP = svc.AdminHTTPPort() + off
	}
	return r
}

// FreePorts returns a Ports with every port of a one-replica stack of the
// declared services free on loopback (for tests).
func FreePorts() (Ports, error) { return FreePortsFor(1) }

// FreePortsFor returns a Ports with every port of a stack of replicas
// replicas of every declared service free on loopback (for tests).
func FreePortsFor(replicas int) (Ports, error) {
	if replicas < 1 {
		return Ports{}, errors.New("localstack: FreePortsFor needs at least one replica")
	}
	c, err := declared.Catalog()
	if err != nil {
		return Ports{}, err
	}
	ps, err := pgtest.FreePorts(2 + 4*replicas*len(c))
	if err != nil {
		return Ports{}, err
	}
	p := Ports{Emulator: ps[0], Issuer: ps[1], Services: map[string][]ServicePorts{}}
	ps = ps[2:]
	for _, svc := range c {
		for range replicas {
			p.Services[svc.Name] = append(p.Services[svc.Name], ServicePorts{GRPC: ps[0], HTTP: ps[1], AdminGRPC: ps[2], AdminHTTP: ps[3]})
			ps = ps[4:]
		}
	}
	return p, nil
}

// AllPorts lists every port of p for the catalog's services with replicas
// replicas replicas, the emulator's and the issuer's first (for tests that
// check they are closed).
func (p Ports) AllPorts(c catalog.Catalog, replicas int) []int {
	out := []int{p.Emulator, p.Issuer}
	for _, svc := range c {
		for k := 1; k <= replicas; k++ {
			r := p.replica(svc, k)
			out = append(out, r.GRPC, r.HTTP)
			if r.AdminGRPC != 0 {
				out = append(out, r.AdminGRPC, r.AdminHTTP)
			}
		}
	}
	return out
}

// Config of a local stack.
type Config struct {
	// BinDir holds the binaries (see Build). Required.
	BinDir string
	// DatabaseURL of an existing server (any database on it); the stack
	// creates its databases there. Default "": start an ephemeral cluster.
	DatabaseURL string
	// Services are the services to run, in start order. Default: the
	// declarations of the checkout holding the working directory
	// (declared.Catalog).
	Services catalog.Catalog
	// DatabasePrefix is prepended to the declared database names, so several
	// stacks can share a server. Default "".
	DatabasePrefix string
	// Fsync starts the ephemeral cluster with fsync=on (benchmarks; see
	// benchkit.EnvFsync). Default false. Ignored with DatabaseURL.
	Fsync bool
	// EmulatorHost of an existing Pub/Sub emulator. Default "": start ours.
	EmulatorHost string
	// ProjectID of the Pub/Sub project. Default "lossless-local".
	ProjectID string
	// Ports of the services. Zero values take the defaults.
	Ports Ports
	// Replicas of each service. Default 1.
	// Replicas of a service share its database and Pub/Sub subscriptions;
	// each has its own ports (see Ports.More) and instance id
	// ("<service>-<k>": env INSTANCE_ID, OTEL service.instance.id, the outbox
	// relay id and the prefix of its log lines). Workorder replica k hands
	// off to provider-sim replica ((k−1) mod Replicas)+1 ({grpc:provider-sim}
	// in its declaration's local_env): PROVIDER_ADDR takes one address, and
	// any workorder replica's relay dispatches any pending hand-off, so a
	// killed provider replica delays, never strands, orders.
	Replicas int
	// OperatorToken guards the operator endpoints of every service (the
	// {operator_token} of the declarations' local_env). Default: 32 random
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
	// TraceEndpoint, when set, is every service's OTEL_EXPORTER_OTLP_ENDPOINT
	// (e.g. internal/devtools/tracestore's "http://127.0.0.1:<port>"), with spans
	// exported every 200 ms instead of the SDK's 5 s, so a trace is
	// complete moments after the order. ExtraEnv may override both.
	// Default "": no tracing.
	TraceEndpoint string
	// TraceURL is the {trace_url} of the declarations' local_env: the HTTP
	// API of the trace store TraceEndpoint feeds (internal/devtools/tracestore's
	// Server.URL), read by the console. Default "".
	TraceURL string
	// TLS turns on TLS between every process (docs/adr/0018): a CA made for
	// this stack (internal/devtools/localca) issues each replica a certificate,
	// passed as TLS_CERT_FILE, TLS_KEY_FILE and TLS_CA_FILE, so every gRPC
	// and HTTP listener serves TLS and requires a client certificate of the
	// CA on gRPC (mTLS); Instance.URL becomes https://. The ephemeral
	// PostgreSQL serves TLS too and the services connect with
	// sslmode=verify-full. Not covered: the Pub/Sub emulator (plaintext
	// gRPC only; Google's endpoints carry TLS in production) and the
	// in-process trace store. Stack.ClientTLS is the side tests and tools
	// dial with. Default false.
	TLS bool
	// Pprof serves every replica's Go profiles on a loopback port of its
	// own (PPROF_ADDR; Instance.PprofURL), for the benchmarks that profile
	// the services. Default false.
	Pprof bool
	// Links routes each replica's connections through addresses of the
	// caller's (a fault-injecting or delaying proxy per link, e.g.
	// internal/testkit/netfault's Harness.Route). It is called once per replica and
	// target when the stack starts, with the replica's instance id
	// ("workorder-1"), the target ("postgres": its DATABASE_URL's host;
	// "pubsub": PUBSUB_EMULATOR_HOST; or the name of a service it dials,
	// such as "provider-sim" for workorder's PROVIDER_ADDR) and the
	// target's host:port, and returns the host:port the replica dials
	// instead: addr itself leaves that link direct. A supervised restart
	// keeps its replica's links. Migrations, provisioning and the stack's
	// own clients (Stack.DSN, Stack.Emulator) connect directly. Default
	// nil: every connection is direct.
	Links func(instance, target, addr string) (string, error)
}

// Link targets of Config.Links besides the services' names.
const (
	LinkPostgres = "postgres"
	LinkPubSub   = "pubsub"
)

// Stack is a running local system.
type Stack struct {
	cfg       Config
	cluster   *pgtest.Cluster
	logMu     sync.Mutex
	procs     map[string]*Process // by instance id; a service name names replica 1
	order     []string            // instance ids in start order
	instances []Instance
	DSN       map[string]string // declared database name (e.g. providersim) -> URL of its owner
	// RuntimeDSN is the URL of each database as its runtime role, the one
	// the servers connect as (runtime_role.go); DSN's owner runs migrate.
	RuntimeDSN map[string]string
	Emulator   string // host:port
	// OperatorToken is the bearer token of every service's operator
	// endpoints (Config.OperatorToken, or the one generated).
	OperatorToken string
	// CA is the stack's certificate authority with Config.TLS, else nil;
	// its files live in a folder Stop removes.
	CA    *localca.CA
	caDir string
	// ClientTLS is the client side of the stack's TLS (the CA and a client
	// certificate of its own) with Config.TLS; nil (plaintext) without.
	// Its DialOption and HTTPClient reach every service.
	ClientTLS *server.TLS
	// ClientCert is ClientTLS's certificate files, for tools run as
	// separate processes (TLS_CERT_FILE, TLS_KEY_FILE). Empty without TLS.
	ClientCert localca.Pair
	issuer     *issuer
}

// Instance is one replica of a service.
type Instance struct {
	ID      string // "<service>-<replica>", e.g. "workorder-2"
	Service string // a declared service name
	Replica int    // 1-based
	GRPC    string // host:port
	URL     string // REST base URL, also /healthz, /readyz
	// AdminGRPC (host:port) and AdminURL (base URL: the admin REST
	// gateway, /metrics) are the admin listeners; "" for a service without
	// gRPC (the console).
	AdminGRPC string
	AdminURL  string
	// PprofURL is the base URL of the replica's profiles listener
	// (<PprofURL>/debug/pprof/heap) with Config.Pprof, else "".
	PprofURL string
}

// NewOperatorToken returns 32 random bytes, hex-encoded.
func NewOperatorToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("localstack: operator token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Build compiles the binaries of the services declared under repoRoot's
// services/ folder and the Pub/Sub emulator into dir (static, like `make
// build`), in one `go build`.
func Build(ctx context.Context, repoRoot, dir string) error {
	c, err := declared.Load(repoRoot)
	if err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-o", dir + string(filepath.Separator)}
	for _, svc := range c {
		args = append(args, "./services/"+svc.Name)
	}
	args = append(args, "./cmd/pubsub-emulator")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %v: %w\n%s", args[4:], err, out)
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
	if len(cfg.Services) == 0 {
		c, err := declared.Catalog()
		if err != nil {
			return nil, err
		}
		cfg.Services = c
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.Ports.Emulator == 0 {
		cfg.Ports.Emulator = 8085
	}
	if cfg.Ports.Issuer == 0 {
		cfg.Ports.Issuer = 8086
	}
	s := &Stack{cfg: cfg, procs: map[string]*Process{}, DSN: map[string]string{}, RuntimeDSN: map[string]string{}, OperatorToken: cfg.OperatorToken}
	defer func() {
		if err != nil {
			_ = s.Stop(10 * time.Second)
		}
	}()

	if cfg.TLS {
		if err := s.startCA(); err != nil {
			return nil, err
		}
	}
	if err := s.startIssuer(cfg.Ports.Issuer); err != nil {
		return nil, err
	}

	dbServer := cfg.DatabaseURL
	if dbServer == "" {
		s.logf("postgres", "starting an ephemeral PostgreSQL cluster from the local binaries")
		opts := pgtest.ClusterOptions{Fsync: cfg.Fsync}
		if s.CA != nil {
			pg, err := s.CA.Issue("postgres")
			if err != nil {
				return nil, err
			}
			opts.TLSCertFile, opts.TLSKeyFile = pg.CertFile, pg.KeyFile
		}
		s.cluster, err = pgtest.StartCluster(ctx, opts)
		if err != nil {
			return nil, err
		}
		dbServer = s.cluster.DSN("postgres")
		if s.CA != nil {
			dbServer = verifyFull(dbServer, s.CA.CAFile())
		}
		s.logf("postgres", "listening on 127.0.0.1:%d (TLS %v)", s.cluster.Port(), s.CA != nil)
	}
	for _, svc := range cfg.Services {
		if svc.Database == "" {
			continue // a service without a database (the console)
		}
		if s.DSN[svc.Database], err = ensureDatabase(ctx, dbServer, cfg.DatabasePrefix+svc.Database); err != nil {
			return nil, err
		}
		if s.RuntimeDSN[svc.Database], err = s.ensureRuntimeRole(ctx, s.DSN[svc.Database]); err != nil {
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

	// One-shot jobs: provisioning (each service with a Pub/Sub declaration
	// provisions its own part; all of them before any service starts, so no
	// publisher runs before every subscription to its topics exists),
	// migrations.
	for _, svc := range cfg.Services {
		if len(svc.Publishes)+len(svc.Subscribes) == 0 {
			continue
		}
		if err := s.oneShot(ctx, "provision-"+svc.Name, svc.Name, "provision"); err != nil {
			return nil, err
		}
	}
	for _, svc := range cfg.Services {
		if svc.Database == "" {
			continue
		}
		if err := s.oneShot(ctx, "migrate-"+svc.Name, svc.Name, "migrate"); err != nil {
			return nil, err
		}
	}

	// Every service reads its listen addresses from GRPC_ADDR, HTTP_ADDR,
	// ADMIN_GRPC_ADDR and ADMIN_HTTP_ADDR; the rest comes from its
	// declaration's local_env.
	for _, svc := range cfg.Services {
		for k := 1; k <= cfg.Replicas; k++ {
			in := s.instance(svc, k)
			env := []string{
				"GRPC_ADDR=" + in.GRPC,
				"HTTP_ADDR=" + in.httpAddr(),
				"INSTANCE_ID=" + in.ID,
				"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" + in.ID,
			}
			if in.AdminGRPC != "" {
				_, adminHTTP, _ := strings.Cut(in.AdminURL, "://")
				env = append(env, "ADMIN_GRPC_ADDR="+in.AdminGRPC, "ADMIN_HTTP_ADDR="+adminHTTP)
			}
			if cfg.Pprof {
				port, err := pgtest.FreePort()
				if err != nil {
					return nil, err
				}
				addr := fmt.Sprintf("127.0.0.1:%d", port)
				env = append(env, "PPROF_ADDR="+addr)
				in.PprofURL = "http://" + addr
			}
			if s.CA != nil {
				pair, err := s.CA.Issue(in.ID)
				if err != nil {
					return nil, err
				}
				env = append(env, "TLS_CERT_FILE="+pair.CertFile, "TLS_KEY_FILE="+pair.KeyFile, "TLS_CA_FILE="+s.CA.CAFile())
			}
			if cfg.TraceEndpoint != "" {
				env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+cfg.TraceEndpoint, "OTEL_BSP_SCHEDULE_DELAY=200")
			}
			routed, err := s.replicaEnv(svc, in, k)
			if err != nil {
				return nil, err
			}
			env = append(env, routed...)
			p := s.add(in.ID, svc.Name, []string{"serve"}, env...)
			p.Supervise = true
			if k == 1 {
				s.procs[svc.Name] = p
			}
			s.instances = append(s.instances, in)
		}
	}
	// Replicas of one service start together; readiness is awaited before
	// the next service, so a consumer never starts ahead of its producer.
	for _, svc := range cfg.Services.Names() {
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

// replicaEnv is replica k's local_env, expanded, with each address routed
// through Config.Links, and, with Links, its DATABASE_URL and
// PUBSUB_EMULATOR_HOST routed too (they win over add's direct ones: the
// last of duplicate variables is the one a process sees).
func (s *Stack) replicaEnv(svc catalog.Service, in Instance, k int) ([]string, error) {
	cfg := s.cfg
	var errs []error
	route := func(target, addr string) string {
		if cfg.Links == nil {
			return addr
		}
		out, err := cfg.Links(in.ID, target, addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("localstack: link %s -> %s: %w", in.ID, target, err))
			return addr
		}
		return out
	}
	env := svc.ExpandEnv(in.ID, cfg.OperatorToken, func(kind, dep string) string {
		if kind == "trace_url" {
			return cfg.TraceURL
		}
		d, _ := cfg.Services.Service(dep) // the catalog checked that it exists
		peer := s.instance(d, (k-1)%cfg.Replicas+1)
		switch kind {
		case "http", "admin_http":
			u := peer.URL
			if kind == "admin_http" {
				u = peer.AdminURL
			}
			scheme, addr, _ := strings.Cut(u, "://")
			return scheme + "://" + route(dep, addr)
		case "admin_grpc":
			return route(dep, peer.AdminGRPC)
		}
		return route(dep, peer.GRPC)
	})
	if cfg.Links != nil {
		if svc.Database != "" {
			dsn := databaseEnv(s.DSN[svc.Database], s.RuntimeDSN[svc.Database], []string{"serve"})[0]
			u, err := url.Parse(strings.TrimPrefix(dsn, "DATABASE_URL="))
			if err != nil {
				return nil, fmt.Errorf("localstack: %s: database URL: %w", in.ID, err)
			}
			u.Host = route(LinkPostgres, u.Host)
			env = append(env, "DATABASE_URL="+u.String())
		}
		env = append(env, "PUBSUB_EMULATOR_HOST="+route(LinkPubSub, s.Emulator))
	}
	return env, errors.Join(errs...)
}

// instance describes replica k of svc.
func (s *Stack) instance(svc catalog.Service, k int) Instance {
	r := s.cfg.Ports.replica(svc, k)
	scheme := "http"
	if s.cfg.TLS {
		scheme = "https"
	}
	in := Instance{
		ID:      fmt.Sprintf("%s-%d", svc.Name, k),
		Service: svc.Name,
		Replica: k,
		GRPC:    fmt.Sprintf("127.0.0.1:%d", r.GRPC),
		URL:     fmt.Sprintf("%s://127.0.0.1:%d", scheme, r.HTTP),
	}
	if r.AdminGRPC != 0 {
		in.AdminGRPC = fmt.Sprintf("127.0.0.1:%d", r.AdminGRPC)
		in.AdminURL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, r.AdminHTTP)
	}
	return in
}

// httpAddr is the host:port of the instance's HTTP listener.
func (in Instance) httpAddr() string {
	_, addr, _ := strings.Cut(in.URL, "://")
	return addr
}

// startCA makes the stack's CA in a folder of its own and the client side
// the stack and its tests dial with.
func (s *Stack) startCA() error {
	dir, err := os.MkdirTemp("", "lossless-tls-")
	if err != nil {
		return fmt.Errorf("localstack: TLS folder: %w", err)
	}
	s.caDir = dir
	if s.CA, err = localca.New(dir); err != nil {
		return err
	}
	if s.ClientCert, err = s.CA.Issue("client"); err != nil {
		return err
	}
	s.ClientTLS, err = server.NewTLS(server.TLSConfig{CertFile: s.ClientCert.CertFile, KeyFile: s.ClientCert.KeyFile, CAFile: s.CA.CAFile()})
	if err != nil {
		return err
	}
	s.logf("tls", "local CA in %s: every process serves TLS, gRPC requires client certificates", dir)
	return nil
}

// verifyFull makes a cluster's DSN (sslmode=disable) verify the server's
// certificate against caFile.
func verifyFull(dsn, caFile string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", caFile)
	u.RawQuery = q.Encode()
	return u.String()
}

// HTTPClient reaches the services' HTTP listeners: over TLS with ClientTLS
// when the stack runs TLS.
func (s *Stack) HTTPClient(timeout time.Duration) *http.Client {
	return s.ClientTLS.HTTPClient(timeout)
}

// DialOption is the transport of a gRPC client of the services: TLS with
// ClientTLS (mTLS) when the stack runs TLS, else plaintext. Add per-RPC
// credentials and other options beside it.
func (s *Stack) DialOption() grpc.DialOption { return s.ClientTLS.DialOption() }

// Services are the services the stack runs, in start order.
func (s *Stack) Services() catalog.Catalog { return slices.Clone(s.cfg.Services) }

// ProjectID is the Pub/Sub project of the stack.
func (s *Stack) ProjectID() string { return s.cfg.ProjectID }

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

// MetricsURL is the base URL where the instance serves /metrics: its admin
// HTTP listener, the console's one listener.
func (in Instance) MetricsURL() string {
	if in.AdminURL != "" {
		return in.AdminURL
	}
	return in.URL
}

// MetricsURLs are the MetricsURL of the services' replica 1.
func (s *Stack) MetricsURLs() map[string]string {
	out := map[string]string{}
	for _, in := range s.instances {
		if in.Replica == 1 {
			out[in.Service] = in.MetricsURL()
		}
	}
	return out
}

// AdminGRPCAddrs are the admin gRPC addresses (the operator services) of
// the services' replica 1; the console has none.
func (s *Stack) AdminGRPCAddrs() map[string]string {
	out := map[string]string{}
	for _, in := range s.instances {
		if in.Replica == 1 && in.AdminGRPC != "" {
			out[in.Service] = in.AdminGRPC
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
	hc := s.HTTPClient(5 * time.Second)
	defer hc.CloseIdleConnections()
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited during start-up: %w", name, err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if resp, err := hc.Do(req); err == nil {
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
	if s.caDir != "" {
		_ = os.RemoveAll(s.caDir)
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
	if !servicesOnly {
		s.stopIssuer()
	}
	return errors.Join(errs...)
}

// add registers a process named name running binary (a service's).
func (s *Stack) add(name, binary string, args []string, env ...string) *Process {
	svcEnv := []string{
		"PUBSUB_EMULATOR_HOST=" + s.Emulator,
		"PUBSUB_PROJECT_ID=" + s.cfg.ProjectID,
	}
	if svc, ok := s.cfg.Services.Service(binary); ok && svc.Database != "" {
		svcEnv = append(svcEnv, databaseEnv(s.DSN[svc.Database], s.RuntimeDSN[svc.Database], args)...)
	}
	if _, ok := s.cfg.Services.Service(binary); ok {
		svcEnv = append(svcEnv, s.authEnv(binary)...)
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
