// Package server is the process plumbing every lossless service shares: a
// public gRPC server and HTTP server (grpc-gateway REST, health, readiness),
// an admin pair of them (the operator services, their REST gateway,
// metrics; see Config.AdminGRPCAddr), background workers (relays,
// subscribers), request validation, and a graceful shutdown that is
// actually reached and actually bounded.
//
// Shutdown order on context cancellation:
//  1. readiness turns false (HTTP /readyz 503, gRPC health NOT_SERVING), so
//     load balancers stop sending new work;
//  2. workers' contexts are cancelled: they stop claiming and finish or
//     release in-flight work; in parallel both gRPC servers drain
//     (GracefulStop) and both HTTP servers drain (Shutdown);
//  3. everything is awaited up to ShutdownTimeout; past it, gRPC is stopped
//     hard and Run returns an error, so the exit code tells the truth.
//
// Lesson: every bound a service needs at its edge (body size, header, read,
// idle and request deadlines) and on its way out (a shutdown that ends) is
// set once here, so no service can forget one. Guards H6 (oversize and slow
// HTTP requests: 413, 408, cut-offs, a deadline on every handler), the
// deadline that ends H8's queued requests, and F15's HTTP answer (a
// RetryInfo becomes Retry-After). A worker that returns an error stops the
// process, so a relay never stops silently.
package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"buf.build/go/protovalidate"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Config of the listeners and the shutdown.
type Config struct {
	// GRPCAddr is the gRPC listen address. No default: each service passes its
	// own (workorder ":9090", provider-sim ":9091", billing ":9092"). Use
	// "127.0.0.1:0" in tests for a free port.
	GRPCAddr string
	// HTTPAddr is the HTTP (REST gateway, health, readiness) listen address.
	// No default: workorder ":8080", provider-sim ":8081", billing ":8082".
	HTTPAddr string
	// AdminGRPCAddr is the admin gRPC listen address (env ADMIN_GRPC_ADDR):
	// the services registered on AdminGRPC() (the operator services) are
	// served there and only there. No default here: each service passes its
	// own (workorder ":9190", provider-sim ":9191", billing ":9192"). ""
	// binds no admin gRPC listener (the admin services are then served
	// nowhere). Bound in every role: operators repair through worker
	// replicas too. The deployment lets only the console reach it.
	AdminGRPCAddr string
	// AdminHTTPAddr is the admin HTTP listen address (env ADMIN_HTTP_ADDR):
	// the admin REST gateway (AdminGateway()) and the WithAdminHTTPHandler
	// routes (/metrics). No default here: workorder ":8180", provider-sim
	// ":8181", billing ":8182". "" binds none. Bound in every role; the
	// gateway is mounted when AdminGRPCAddr is set.
	AdminHTTPAddr string
	// ShutdownTimeout bounds the graceful shutdown. Default 20s: longer than
	// one outbox batch or invoice job, shorter than Kubernetes' default 30 s
	// termination grace period, so we exit before being SIGKILLed.
	ShutdownTimeout time.Duration

	// MaxBodyBytes bounds an HTTP request body. Default 1 MiB: a work order
	// is a few KiB. A larger body is refused with 413 before it is buffered.
	// (gRPC has its own bound: grpc-go refuses messages over 4 MiB.)
	MaxBodyBytes int64
	// ReadHeaderTimeout bounds reading an HTTP request's headers, so a client
	// that never finishes them (slow loris) does not hold a connection.
	// Default 5s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole HTTP request, headers and body; a
	// body trickled slower is answered 408 and the connection closed.
	// Default 15s: a 1 MiB body at a slow mobile 1 Mbit/s takes 8 s.
	ReadTimeout time.Duration
	// RequestTimeout is the deadline of every gRPC (and so REST) handler: set
	// when the client sent none, shortened when it sent a longer one.
	// Default 10s.
	RequestTimeout time.Duration
	// WriteTimeout bounds an HTTP exchange from the end of its headers to the
	// end of the response. Must exceed RequestTimeout by more than the
	// gateway's 1s reply margin, or a handler that uses its whole
	// deadline loses its response. Default RequestTimeout + 5s.
	WriteTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long. Default 60s.
	IdleTimeout time.Duration
	// PprofAddr, when set, serves the Go runtime's profiles (CPU, heap,
	// goroutines...) under /debug/pprof/ on a listener of its own (env
	// PPROF_ADDR), never on the HTTP listener. Default "": off. A profile
	// exposes code paths and memory contents and costs CPU while it runs,
	// and the endpoints have no authentication, so the address must be a
	// loopback one (127.0.0.1:6060, [::1]:6060, localhost:6060; Validate
	// refuses any other): reach it with `kubectl port-forward` or from the
	// host the process runs on (benchmarks profile every service this way).
	PprofAddr string
	// TLS of the gRPC and HTTP listeners (public and admin) and of the
	// gateways' loopback connections (env TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE,
	// TLS_CLIENT_AUTH). Default: plaintext. See TLSConfig.
	TLS TLSConfig
	// Role is what this replica runs (env SERVICE_ROLE, flag serve --role):
	// RoleAll (default, "" too) the API and the workers; RoleAPI the gRPC and
	// REST API only, WithWorker loops are not started; RoleWorker the
	// workers only, with /healthz, /readyz and the WithHTTPHandler routes
	// on the HTTP listener: no public gRPC listener is bound (GRPCAddr is
	// then unused and GRPCAddr() returns "") and the public REST gateway is
	// not mounted (404). The admin listeners run in every role. Scaling the
	// two apart is docs/adr/0013.
	Role Role
	// GRPC bounds each gRPC connection's header list and concurrent calls
	// (default 64 KiB, 256). See GRPCLimits.
	GRPC GRPCLimits
}

// Role selects what a replica runs; see Config.Role.
type Role string

// The roles. The zero value means RoleAll.
const (
	RoleAll    Role = "all"
	RoleAPI    Role = "api"
	RoleWorker Role = "worker"
)

// Validate accepts "", "all", "api" and "worker".
func (r Role) Validate() error {
	switch r {
	case "", RoleAll, RoleAPI, RoleWorker:
		return nil
	}
	return fmt.Errorf("role %q: want api, worker or all", string(r))
}

// ParseServeFlags parses the arguments of a service's `serve` subcommand:
// --role (api, worker or all), which overrides the environment's
// SERVICE_ROLE ("" when not given). Any other argument is refused.
func ParseServeFlags(args []string) (Role, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	role := fs.String("role", "", "what this replica runs: api, worker or all (default: SERVICE_ROLE, else all)")
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if fs.NArg() > 0 {
		return "", fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	r := Role(*role)
	if err := r.Validate(); err != nil {
		return "", fmt.Errorf("--role: %w", err)
	}
	return r, nil
}

// ServesAPI reports whether the role serves the gRPC and REST API.
func (r Role) ServesAPI() bool { return r != RoleWorker }

// RunsWorkers reports whether the role runs the background loops.
func (r Role) RunsWorkers() bool { return r != RoleAPI }

// Validate reports missing or invalid settings.
func (c Config) Validate() error {
	var errs []error
	if c.GRPCAddr == "" && c.Role.ServesAPI() {
		errs = append(errs, errors.New("gRPC listen address is empty"))
	}
	if c.HTTPAddr == "" {
		errs = append(errs, errors.New("HTTP listen address is empty"))
	}
	// Two listeners on one address would fail to bind, or, with port 0,
	// would be told apart by nobody; say which.
	addrs := map[string]string{}
	for _, a := range []struct{ name, addr string }{
		{"gRPC", c.GRPCAddr}, {"HTTP", c.HTTPAddr}, {"admin gRPC", c.AdminGRPCAddr}, {"admin HTTP", c.AdminHTTPAddr},
	} {
		if a.addr == "" || strings.HasSuffix(a.addr, ":0") || (a.name == "gRPC" && !c.Role.ServesAPI()) {
			continue
		}
		if other, dup := addrs[a.addr]; dup {
			errs = append(errs, fmt.Errorf("%s listen address %s is also the %s one", a.name, a.addr, other))
			continue
		}
		addrs[a.addr] = a.name
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("shutdown timeout must not be negative"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("max body bytes must not be negative"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"read header timeout", c.ReadHeaderTimeout}, {"read timeout", c.ReadTimeout},
		{"request timeout", c.RequestTimeout}, {"write timeout", c.WriteTimeout}, {"idle timeout", c.IdleTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", d.name))
		}
	}
	if c.WriteTimeout > 0 && c.WriteTimeout <= c.RequestTimeout+gatewayReplyMargin {
		errs = append(errs, fmt.Errorf("write timeout %v must exceed request timeout %v by more than %v", c.WriteTimeout, c.RequestTimeout, gatewayReplyMargin))
	}
	if err := c.Role.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("SERVICE_ROLE (serve --role): %w", err))
	}
	if c.PprofAddr != "" {
		if err := ValidateLoopback(c.PprofAddr); err != nil {
			errs = append(errs, fmt.Errorf("pprof address: %w", err))
		}
	}
	if err := c.TLS.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.GRPC.Validate())
	return errors.Join(errs...)
}

// Defaults of Config's limits.
const (
	DefaultShutdownTimeout   = 20 * time.Second
	DefaultMaxBodyBytes      = 1 << 20
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultRequestTimeout    = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

func (c *Config) setDefaults() {
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = c.RequestTimeout + 5*time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Role == "" {
		c.Role = RoleAll
	}
}

// readyLogInterval spaces the log lines of a readiness check that keeps
// failing: probes poll every few seconds.
const readyLogInterval = time.Minute

// Option customises a Server.
type Option func(*options)

type options struct {
	workers      []worker
	auth         []grpc.UnaryServerInterceptor
	callerAuth   *callerAuth
	interceptors []grpc.UnaryServerInterceptor
	grpcOpts     []grpc.ServerOption
	handlers     []route
	adminRoutes  []route
	muxOpts      []runtime.ServeMuxOption
}

type worker struct {
	name string
	run  func(context.Context) error
}

type route struct {
	pattern string
	handler http.Handler
}

// WithWorker runs fn for the server's lifetime, unless Config.Role is
// RoleAPI. fn must return when its
// context is cancelled, after finishing or releasing in-flight work. A worker
// that fails (returns a non-nil error before shutdown) shuts the whole process
// down: a relay that silently stopped is the failure this system exists to
// prevent.
func WithWorker(name string, fn func(ctx context.Context) error) Option {
	return func(o *options) { o.workers = append(o.workers, worker{name, fn}) }
}

// WithAuthInterceptors adds interceptors that run before request
// validation, so a caller without credentials is refused before learning
// anything about its request.
func WithAuthInterceptors(i ...grpc.UnaryServerInterceptor) Option {
	return func(o *options) { o.auth = append(o.auth, i...) }
}

// WithUnaryInterceptors adds interceptors after the built-in recovery and
// validation interceptors.
func WithUnaryInterceptors(i ...grpc.UnaryServerInterceptor) Option {
	return func(o *options) { o.interceptors = append(o.interceptors, i...) }
}

// WithGRPCOptions adds gRPC server options (e.g. stats handlers for tracing).
func WithGRPCOptions(opts ...grpc.ServerOption) Option {
	return func(o *options) { o.grpcOpts = append(o.grpcOpts, opts...) }
}

// WithTelemetry instruments the gRPC server with otelgrpc: a server span per
// call (continuing the caller's W3C trace context from the metadata; the REST
// gateway forwards an HTTP traceparent header as such metadata, see
// HeaderMatcher) and the rpc.server.* metrics (request rate, latency, status
// codes). Health checks are left out: they are polled every few seconds and
// would drown the traces. tel's nil fields are no-ops.
func WithTelemetry(tel telemetry.Providers) Option {
	tel = tel.WithDefaults()
	return WithGRPCOptions(grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tel.TracerProvider),
		otelgrpc.WithMeterProvider(tel.MeterProvider),
		otelgrpc.WithPropagators(tel.Propagator),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	)))
}

// WithHTTPHandler serves handler at pattern on the public HTTP listener.
func WithHTTPHandler(pattern string, handler http.Handler) Option {
	return func(o *options) { o.handlers = append(o.handlers, route{pattern, handler}) }
}

// WithAdminHTTPHandler serves handler at pattern on the admin HTTP listener
// only (e.g. "GET /metrics"): what operators and the scraper read, not
// clients.
func WithAdminHTTPHandler(pattern string, handler http.Handler) Option {
	return func(o *options) { o.adminRoutes = append(o.adminRoutes, route{pattern, handler}) }
}

// HTTPHandlers are the handlers opts add with WithHTTPHandler and
// WithAdminHTTPHandler, by pattern: for a process that serves HTTP on one
// listener without a Server (the console), given the options Serve passes
// every process.
func HTTPHandlers(opts ...Option) map[string]http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	hs := make(map[string]http.Handler, len(o.handlers)+len(o.adminRoutes))
	for _, r := range append(o.handlers, o.adminRoutes...) {
		hs[r.pattern] = r.handler
	}
	return hs
}

// WithGatewayOptions adds grpc-gateway ServeMux options.
func WithGatewayOptions(opts ...runtime.ServeMuxOption) Option {
	return func(o *options) { o.muxOpts = append(o.muxOpts, opts...) }
}

// Server is one service process's network surface and workers.
type Server struct {
	cfg     Config
	log     *slog.Logger
	opts    options
	grpc    *grpc.Server
	health  *health.Server
	mux     *runtime.ServeMux
	http    *http.Server
	grpcLis net.Listener
	httpLis net.Listener
	// admin is the operator surface, on listeners of its own.
	admin  surface
	ready  atomic.Bool
	mu     sync.Mutex
	checks map[string]func(context.Context) error
	gwConn *grpc.ClientConn
	tls    *TLS // nil: plaintext
	// pprof serves the profiles on pprofLis (Config.PprofAddr); nil when off.
	pprof    *http.Server
	pprofLis net.Listener
	started  atomic.Bool
	// readyLog spaces the log lines of a failing readiness check.
	readyLog *logThrottle
}

// surface is the admin gRPC server, its REST gateway and HTTP server, on
// the listeners Config.AdminGRPCAddr and AdminHTTPAddr (nil when unset).
type surface struct {
	grpc    *grpc.Server
	mux     *runtime.ServeMux
	http    *http.Server
	gwConn  *grpc.ClientConn
	grpcLis net.Listener
	httpLis net.Listener
}

// New binds the listeners (so ":0" addresses are resolved before Run) and
// builds the servers. Register the public services on GRPC() and their
// gateway handlers on Gateway(), the operator services on AdminGRPC() and
// AdminGateway(), before calling Run.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	if logger == nil {
		return nil, errors.New("server: logger is nil")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{cfg: cfg, log: logger, checks: map[string]func(context.Context) error{}, readyLog: newLogThrottle(readyLogInterval)}
	if cfg.TLS.Serves() {
		t, err := NewTLS(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		s.tls = t
		s.opts.grpcOpts = append(s.opts.grpcOpts, grpc.Creds(credentials.NewTLS(t.serverConfig(ClientAuthRequire, nil))))
	}
	for _, o := range opts {
		o(&s.opts)
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("server: build validator: %w", err)
	}
	// Outermost: every error, including a recovered panic's and an auth
	// refusal, leaves as a public status.
	chain := []grpc.UnaryServerInterceptor{publicErrorsUnary(logger), recoverUnary(logger), deadlineUnary(cfg.RequestTimeout)}
	serverOpts := append(serverKeepalive(), cfg.GRPC.serverOptions()...)
	if ca := s.opts.callerAuth; ca != nil {
		ca.log = logger
		chain = append(chain, ca.unary())
		serverOpts = append(serverOpts, grpc.ChainStreamInterceptor(ca.stream()))
	}
	chain = append(chain, s.opts.auth...)
	chain = append(chain, validateUnary(validator))
	chain = append(chain, s.opts.interceptors...)
	if !cfg.Role.RunsWorkers() {
		s.opts.workers = nil
	}
	serverOpts = append(serverOpts, grpc.ChainUnaryInterceptor(chain...))
	// The admin server has the same interceptors, bounds and TLS: only
	// what it serves differs.
	s.grpc = grpc.NewServer(append(serverOpts, s.opts.grpcOpts...)...)
	s.admin.grpc = grpc.NewServer(append(serverOpts, s.opts.grpcOpts...)...)
	s.health = health.NewServer()
	// Not serving until Run has started every listener and worker.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)

	if err := s.listen(); err != nil {
		s.closeListeners()
		return nil, err
	}
	if s.grpcLis != nil {
		if s.gwConn, err = s.dialSelf(s.grpcLis); err != nil {
			s.closeListeners()
			return nil, err
		}
	}
	if s.admin.grpcLis != nil {
		if s.admin.gwConn, err = s.dialSelf(s.admin.grpcLis); err != nil {
			s.closeConns()
			s.closeListeners()
			return nil, err
		}
	}
	s.mux = s.newGatewayMux()
	s.admin.mux = s.newGatewayMux()

	httpMux := http.NewServeMux()
	httpMux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	httpMux.HandleFunc("GET /readyz", s.serveReadyz)
	for _, r := range s.opts.handlers {
		httpMux.Handle(r.pattern, r.handler)
	}
	if cfg.Role.ServesAPI() {
		httpMux.Handle("/", s.mux)
	}
	s.http = s.newHTTPServer(httpMux, "http")
	if s.admin.httpLis != nil {
		adminMux := http.NewServeMux()
		for _, r := range s.opts.adminRoutes {
			adminMux.Handle(r.pattern, r.handler)
		}
		if s.admin.grpcLis != nil {
			adminMux.Handle("/", s.admin.mux)
		}
		s.admin.http = s.newHTTPServer(adminMux, "admin-http")
	}
	if cfg.PprofAddr != "" {
		s.pprof = newPprofServer(cfg.WriteTimeout)
	}
	return s, nil
}

// listen binds every configured listener.
func (s *Server) listen() error {
	lc := net.ListenConfig{}
	bind := func(lis *net.Listener, name, addr string) error {
		l, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return fmt.Errorf("server: listen %s on %s: %w", name, addr, err)
		}
		*lis = l
		return nil
	}
	if s.cfg.Role.ServesAPI() {
		if err := bind(&s.grpcLis, "gRPC", s.cfg.GRPCAddr); err != nil {
			return err
		}
	}
	if err := bind(&s.httpLis, "HTTP", s.cfg.HTTPAddr); err != nil {
		return err
	}
	if s.cfg.AdminGRPCAddr != "" {
		if err := bind(&s.admin.grpcLis, "admin gRPC", s.cfg.AdminGRPCAddr); err != nil {
			return err
		}
	}
	if s.cfg.AdminHTTPAddr != "" {
		if err := bind(&s.admin.httpLis, "admin HTTP", s.cfg.AdminHTTPAddr); err != nil {
			return err
		}
	}
	if s.cfg.PprofAddr != "" {
		return bind(&s.pprofLis, "pprof", s.cfg.PprofAddr)
	}
	return nil
}

// dialSelf connects a gateway to our own gRPC listener lis, so REST
// requests pass through exactly the same interceptors (validation, auth,
// tracing) as gRPC requests; RegisterXHandlerServer would bypass them.
// With TLS it presents the process's own certificate, and verifies the
// listener's as "localhost".
func (s *Server) dialSelf(lis net.Listener) (*grpc.ClientConn, error) {
	gwOpts := []grpc.DialOption{s.tls.DialOption(), ClientKeepalive()}
	if s.tls != nil {
		gwOpts = append(gwOpts, grpc.WithAuthority("localhost"))
	}
	conn, err := grpc.NewClient(dialTarget(lis.Addr()), gwOpts...)
	if err != nil {
		return nil, fmt.Errorf("server: gateway connection: %w", err)
	}
	return conn, nil
}

func (s *Server) newGatewayMux() *runtime.ServeMux {
	return runtime.NewServeMux(append([]runtime.ServeMuxOption{
		runtime.WithErrorHandler(GatewayErrorHandler),
		runtime.WithIncomingHeaderMatcher(HeaderMatcher),
	}, s.opts.muxOpts...)...)
}

// httpHeaderHeadroom is what an HTTP request's headers leave of the gRPC
// header-list limit: net/http reads up to 4 KiB beyond MaxHeaderBytes, and
// the gateway adds its own metadata (forwarded-for, its mark, the path).
const httpHeaderHeadroom = 8 << 10

// newHTTPServer serves h with every bound of Config and the TLS.
func (s *Server) newHTTPServer(h http.Handler, component string) *http.Server {
	srv := &http.Server{
		Handler: s.boundHTTP(h),
		// Under the gRPC header-list limit the gateway forwards into, with
		// room for what it adds and net/http's own 4 KiB of slack: an
		// oversize request is 431 here, not a failed forward (500).
		MaxHeaderBytes:    s.cfg.GRPC.WithDefaults().MaxHeaderListBytes - httpHeaderHeadroom,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		// Failed TLS handshakes and the like, as log lines of the service
		// rather than bare lines on stderr.
		ErrorLog: slog.NewLogLogger(s.log.With("component", component).Handler(), slog.LevelWarn),
	}
	if s.tls != nil {
		srv.TLSConfig = s.tls.HTTPServerConfig()
	}
	return srv
}

// GRPC is the public gRPC server to register the public API on.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// AdminGRPC is the admin gRPC server to register the operator services on:
// served on Config.AdminGRPCAddr only, never on the public listener.
func (s *Server) AdminGRPC() *grpc.Server { return s.admin.grpc }

// AdminGateway is the REST mux of the admin services, served on
// Config.AdminHTTPAddr.
func (s *Server) AdminGateway() *runtime.ServeMux { return s.admin.mux }

// AdminGatewayConn is a client connection to the admin gRPC listener, for
// RegisterXHandler(ctx, s.AdminGateway(), s.AdminGatewayConn()). Nil when
// Config.AdminGRPCAddr is unset.
func (s *Server) AdminGatewayConn() *grpc.ClientConn { return s.admin.gwConn }

// AdminGRPCAddr is the bound admin gRPC address; "" when not configured.
func (s *Server) AdminGRPCAddr() string { return addrOf(s.admin.grpcLis) }

// AdminHTTPAddr is the bound admin HTTP address; "" when not configured.
func (s *Server) AdminHTTPAddr() string { return addrOf(s.admin.httpLis) }

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Gateway is the REST mux to register grpc-gateway handlers on.
func (s *Server) Gateway() *runtime.ServeMux { return s.mux }

// GatewayConn is a client connection to this server's own gRPC listener, for
// RegisterXHandler(ctx, s.Gateway(), s.GatewayConn()). Nil in RoleWorker,
// where neither GRPC() nor Gateway() is served: register the API only when
// Config.Role.ServesAPI().
func (s *Server) GatewayConn() *grpc.ClientConn { return s.gwConn }

// GRPCAddr is the bound gRPC address (useful with ":0"); "" in RoleWorker.
func (s *Server) GRPCAddr() string {
	if s.grpcLis == nil {
		return ""
	}
	return s.grpcLis.Addr().String()
}

// HTTPAddr is the bound HTTP address (useful with ":0").
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// PprofAddr is the bound pprof address; "" when Config.PprofAddr is unset.
func (s *Server) PprofAddr() string {
	if s.pprofLis == nil {
		return ""
	}
	return s.pprofLis.Addr().String()
}

// AddReadinessCheck adds a check run by /readyz (e.g. a database ping).
func (s *Server) AddReadinessCheck(name string, check func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = check
}

// Run serves until ctx is cancelled, then shuts down as described in the
// package documentation. It returns nil after a clean, timely shutdown.
func (s *Server) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("server: Run called twice")
	}
	// Worker contexts are independent of ctx so that shutdown can cancel them
	// at the right step, not before readiness flips.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	failed := make(chan error, 5+len(s.opts.workers))
	var serving, working sync.WaitGroup
	serveGRPC := func(name string, srv *grpc.Server, lis net.Listener) {
		if lis == nil {
			return
		}
		serving.Add(1)
		go func() {
			defer serving.Done()
			if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				failed <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
	}
	serveHTTP := func(name string, srv *http.Server, lis net.Listener) {
		if lis == nil {
			return
		}
		serving.Add(1)
		go func() {
			defer serving.Done()
			var err error
			if s.tls != nil {
				// The certificate comes from TLSConfig.GetConfigForClient.
				err = srv.ServeTLS(lis, "", "")
			} else {
				err = srv.Serve(lis)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
	}
	serveGRPC("gRPC", s.grpc, s.grpcLis)
	serveHTTP("HTTP", s.http, s.httpLis)
	serveGRPC("admin gRPC", s.admin.grpc, s.admin.grpcLis)
	serveHTTP("admin HTTP", s.admin.http, s.admin.httpLis)
	if s.pprof != nil {
		serving.Add(1)
		go func() {
			defer serving.Done()
			if err := s.pprof.Serve(s.pprofLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("pprof server: %w", err)
			}
		}()
	}
	for _, w := range s.opts.workers {
		working.Add(1)
		go func() {
			defer working.Done()
			err := w.run(workCtx)
			if err != nil && workCtx.Err() == nil {
				failed <- fmt.Errorf("worker %s: %w", w.name, err)
				return
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("worker stopped with an error during shutdown", "worker", w.name, "error", err)
			}
		}()
	}
	s.ready.Store(true)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.log.Info("serving", "role", s.cfg.Role, "grpc_addr", s.GRPCAddr(), "http_addr", s.HTTPAddr(),
		"admin_grpc_addr", s.AdminGRPCAddr(), "admin_http_addr", s.AdminHTTPAddr(), "workers", len(s.opts.workers))

	var cause error
	select {
	case <-ctx.Done():
		s.log.Info("shutdown requested")
	case cause = <-failed:
		s.log.Error("shutting down after a failure", "error", cause)
	}

	// 1. Stop advertising readiness.
	s.ready.Store(false)
	s.health.Shutdown()

	// 2. Stop workers and drain servers in parallel, bounded by the timeout.
	deadline, cancelDeadline := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancelDeadline()
	cancelWork()
	done := make(chan struct{})
	go func() {
		var drain sync.WaitGroup
		if s.pprof != nil {
			// A CPU profile in progress is cut short: it is a diagnosis,
			// not work to finish.
			_ = s.pprof.Close()
		}
		for _, g := range []*grpc.Server{s.grpc, s.admin.grpc} {
			drain.Go(g.GracefulStop)
		}
		for _, h := range []struct {
			name string
			srv  *http.Server
		}{{"HTTP", s.http}, {"admin HTTP", s.admin.http}} {
			if h.srv == nil {
				continue
			}
			drain.Go(func() {
				if err := h.srv.Shutdown(deadline); err != nil {
					s.log.Warn(h.name+" shutdown", "error", err)
				}
			})
		}
		drain.Wait()
		working.Wait()
		serving.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.log.Info("shutdown complete")
	case <-deadline.Done():
		s.grpc.Stop()
		s.admin.grpc.Stop()
		_ = s.http.Close()
		if s.admin.http != nil {
			_ = s.admin.http.Close()
		}
		cause = errors.Join(cause, fmt.Errorf("server: shutdown exceeded %v", s.cfg.ShutdownTimeout))
		s.log.Error("shutdown timed out; stopped hard", "timeout", s.cfg.ShutdownTimeout)
	}
	s.closeConns()
	return cause
}

func (s *Server) closeConns() {
	for _, c := range []*grpc.ClientConn{s.gwConn, s.admin.gwConn} {
		if c != nil {
			_ = c.Close()
		}
	}
}

func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	s.mu.Lock()
	checks := make(map[string]func(context.Context) error, len(s.checks))
	for k, v := range s.checks {
		checks[k] = v
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	for name, check := range checks {
		if err := check(ctx); err != nil {
			// The cause (addresses, user names) is for operators, not for
			// whoever can reach /readyz.
			if ok, skipped := s.readyLog.allow(name, time.Now()); ok {
				s.log.Warn("not ready", "check", name, "error", err, "similar_failures_not_logged", skipped)
			}
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		s.readyLog.reset(name)
	}
	_, _ = w.Write([]byte("ready\n"))
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.admin.grpcLis, s.admin.httpLis, s.pprofLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// SignalContext is cancelled on SIGTERM or SIGINT: the start of a graceful shutdown.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGTERM, os.Interrupt)
}

func dialTarget(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		// Listening on all interfaces: reach ourselves over loopback.
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return tcp.String()
}

func validateUnary(v protovalidate.Validator) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if msg, ok := req.(proto.Message); ok {
			if err := v.Validate(msg); err != nil {
				return nil, apierror.FromValidation(err)
			}
		}
		return handler(ctx, req)
	}
}

func recoverUnary(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				logger.ErrorContext(ctx, "panic in handler", "method", info.FullMethod, "panic", fmt.Sprint(p))
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		return handler(ctx, req)
	}
}
