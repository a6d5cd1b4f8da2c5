// Package app assembles the console process on the skeleton every service
// shares (internal/servicecmd): the clients of the three services, the web
// console (package web) and its HTTP listener, with /metrics from the
// telemetry, /healthz and /readyz. It has no database and publishes
// nothing.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/console/internal/config"
	"github.com/lossless-dev/lossless/services/console/internal/iap"
	"github.com/lossless-dev/lossless/services/console/internal/login"
	"github.com/lossless-dev/lossless/services/console/internal/overview"
	sessions "github.com/lossless-dev/lossless/services/console/internal/session"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

// pprofWriteTimeout bounds a profile request: a CPU profile of up to a
// minute fits.
const pprofWriteTimeout = 65 * time.Second

// App is the assembled console.
type App struct {
	cfg     config.Config
	log     *slog.Logger
	srv     *http.Server
	ln      net.Listener
	closers []func()
}

// New dials the services (no connection is made before the first call),
// builds the console and binds its listeners. opts are those server.Serve
// passes every process: their HTTP handlers (the telemetry's /metrics) are
// mounted. tel is unused: the console makes no spans and no instruments of
// its own.
func New(ctx context.Context, cfg config.Config, logger *slog.Logger, _ telemetry.Providers, opts ...server.Option) (*App, error) {
	if logger == nil {
		return nil, errors.New("app: logger is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: logger}
	if err := a.assemble(ctx, opts); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *App) assemble(ctx context.Context, opts []server.Option) error {
	cfg, logger := a.cfg, a.log
	// The services' CA and the console's own certificate (nil: plaintext).
	peers, err := server.NewTLS(cfg.ServiceTLS)
	if err != nil {
		return fmt.Errorf("%s: %w", config.ServiceTLSEnvNames, err)
	}
	dial := func(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, append([]grpc.DialOption{peers.DialOption(), server.ClientKeepalive()}, opts...)...)
	}
	// The public APIs get the console's ID token on every call. The
	// operator services get a credential only on a logged-in operator's
	// calls (the web layer names the operator on them): the console's own
	// ID token for that service with the operator's name, or, with no
	// identity of its own (AUTH_DISABLED), the break-glass token
	// (operator.ConsoleDialOptions, docs/adr/0025-authorization.md).
	var wo, woAdmin, prAdmin, bi, biAdmin *grpc.ClientConn
	tokens := map[string]credentials.PerRPCCredentials{}
	for name, c := range map[string]clientauth.Config{"workorder": cfg.WorkorderAuth, "billing": cfg.BillingAuth, "provider-sim": cfg.ProviderAuth} {
		if tokens[name], err = c.PerRPCCredentials(ctx); err != nil {
			return err
		}
	}
	public := func(svc string) []grpc.DialOption {
		opts := []grpc.DialOption{operator.WithoutOperator()}
		if tokens[svc] != nil {
			opts = append(opts, grpc.WithPerRPCCredentials(tokens[svc]))
		}
		return opts
	}
	admin := func(svc string) []grpc.DialOption {
		if cfg.CallsAsItself() {
			return operator.ConsoleDialOptions(tokens[svc], "")
		}
		return operator.ConsoleDialOptions(nil, cfg.OperatorToken)
	}
	// The public APIs and the operator services are on listeners of their
	// own (each service's ADMIN_GRPC_ADDR): one connection to each.
	conns := []struct {
		conn      **grpc.ClientConn
		addr, env string
		opts      []grpc.DialOption
	}{
		{&wo, cfg.Workorder.GRPC, config.EnvWorkorderGRPC, public("workorder")},
		{&woAdmin, cfg.Workorder.AdminGRPC, config.EnvWorkorderAdminGRPC, admin("workorder")},
		{&prAdmin, cfg.Provider.AdminGRPC, config.EnvProviderAdminGRPC, admin("provider-sim")},
		{&bi, cfg.Billing.GRPC, config.EnvBillingGRPC, public("billing")},
		{&biAdmin, cfg.Billing.AdminGRPC, config.EnvBillingAdminGRPC, admin("billing")},
	}
	for _, c := range conns {
		conn, err := dial(c.addr, c.opts...)
		if err != nil {
			return fmt.Errorf("%s: %w", c.env, err)
		}
		a.closers = append(a.closers, func() { _ = conn.Close() })
		*c.conn = conn
	}

	figures, err := overview.NewReader([]overview.Target{
		{Service: "workorder", URL: cfg.Workorder.HTTP + "/metrics"},
		{Service: "provider-sim", URL: cfg.Provider.HTTP + "/metrics"},
		{Service: "billing", URL: cfg.Billing.HTTP + "/metrics"},
	}, peers.HTTPClient(cfg.ScrapeTimeout))
	if err != nil {
		return err
	}
	var operators *login.File
	if cfg.OperatorsFile != "" {
		// Checked for changes at most every 5 s: a removed operator's
		// sessions end within that.
		if operators, err = login.OpenFile(cfg.OperatorsFile, 5*time.Second, nil); err != nil {
			return fmt.Errorf("%s: %w", config.EnvOperatorsFile, err)
		}
	}
	var identity web.IdentityVerifier
	if cfg.IAPAudience != "" {
		if identity, err = iap.New(iap.Config{Audience: cfg.IAPAudience}); err != nil {
			return fmt.Errorf("%s: %w", config.EnvIAPAudience, err)
		}
	}
	console, err := web.New(web.Sources{
		Orders:         workorderv1.NewWorkOrderServiceClient(wo),
		Inbox:          opsv1.NewOperatorServiceClient(woAdmin),
		BillingRepairs: opsv1.NewOperatorServiceClient(biAdmin),
		WorkOrderOps:   opsv1.NewOperatorServiceClient(woAdmin),
		BillingOps:     opsv1.NewOperatorServiceClient(biAdmin),
		ProviderAudit:  opsv1.NewOperatorServiceClient(prAdmin),
		Faults:         providerv1.NewProviderAdminServiceClient(prAdmin),
		Invoices:       billingv1.NewBillingServiceClient(bi),
		Figures:        figures,
		// The Order page's timeline.
		Outbox:       opsv1.NewOperatorServiceClient(woAdmin),
		ProviderJobs: providerv1.NewProviderAdminServiceClient(prAdmin),
		InvoiceJobs:  opsv1.NewOperatorServiceClient(biAdmin),
	}, web.Config{
		OperatorToken:  cfg.OperatorToken,
		Operators:      operators,
		Identity:       identity,
		Sessions:       sessions.Config{TTL: cfg.SessionTTL, Idle: cfg.SessionIdle},
		LoginLimit:     login.LimitConfig{Failures: cfg.LoginFailures, Window: cfg.LoginWindow},
		TrustedProxies: cfg.TrustedProxies,
		ReadOpen:       cfg.ReadOpen,
		SecureCookies:  cfg.Secure(),
		RunbookBaseURL: cfg.RunbookBaseURL,
		RPCTimeout:     cfg.RPCTimeout,
		TraceURL:       cfg.TraceURL,
	}, logger)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	for pattern, h := range server.HTTPHandlers(opts...) {
		mux.Handle(pattern, h)
	}
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	// Ready as soon as it listens: the services it reads may come and go,
	// and each page says which one is unreachable.
	mux.HandleFunc("GET /readyz", ok)
	mux.Handle("/", console)
	if cfg.PprofAddr != "" {
		// On loopback only (config.Validate): the profiles have no
		// authentication. Closed with the process.
		pln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.PprofAddr)
		if err != nil {
			return fmt.Errorf("%s: %w", config.EnvPprofAddr, err)
		}
		psrv := &http.Server{Handler: server.PprofHandler(pprofWriteTimeout), ReadHeaderTimeout: 10 * time.Second, WriteTimeout: pprofWriteTimeout}
		go func() { _ = psrv.Serve(pln) }()
		a.closers = append(a.closers, func() { _ = psrv.Close() })
	}

	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("%s: %w", config.EnvHTTPAddr, err)
	}
	a.ln = ln
	a.closers = append(a.closers, func() { _ = ln.Close() })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(logger.With("component", "http").Handler(), slog.LevelWarn)}
	if cfg.TLS() {
		// The browsers' certificate, reloaded when its files change.
		front, err := server.NewTLS(server.TLSConfig{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile})
		if err != nil {
			return fmt.Errorf("%s / %s: %w", config.EnvTLSCertFile, config.EnvTLSKeyFile, err)
		}
		srv.TLSConfig = front.HTTPServerConfig()
	}
	a.srv = srv
	return nil
}

// HTTPAddr is the bound address of the console's listener.
func (a *App) HTTPAddr() string { return a.ln.Addr().String() }

// Run serves until ctx is cancelled (SIGTERM), then shuts down gracefully
// within SHUTDOWN_TIMEOUT and closes the connections.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	cfg, srv, ln, logger := a.cfg, a.srv, a.ln, a.log
	errc := make(chan error, 1)
	go func() {
		if cfg.TLS() {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	logger.Info("console listening", "addr", ln.Addr().String(), "tls", cfg.TLS(), "read_open", cfg.ReadOpen,
		"login", cfg.OperatorToken != "" || cfg.OperatorsFile != "", "calls_as_itself", cfg.CallsAsItself(), "operators_file", cfg.OperatorsFile != "", "iap", cfg.IAPAudience != "", "secure_cookies", cfg.Secure())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("console stopped")
	return nil
}

// Close releases the listeners and the connections; Run calls it.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}
