// Package config is the console's configuration, read from the environment.
// Every variable, its default and its reason are documented on the field it
// fills; a bad value stops the process at start-up with an error naming the
// variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/console/internal/login"
)

// ServiceName is the console's name in logs and metrics.
const ServiceName = "console"

// Environment variables read by FromEnv.
const (
	EnvHTTPAddr      = "HTTP_ADDR"
	EnvWorkorderGRPC = "CONSOLE_WORKORDER_GRPC_ADDR"
	EnvBillingGRPC   = "CONSOLE_BILLING_GRPC_ADDR"
	// The services' admin gRPC listeners (their ADMIN_GRPC_ADDR): the
	// operator services. provider-sim's is the only one the console calls
	// (it calls no public provider API).
	EnvWorkorderAdminGRPC = "CONSOLE_WORKORDER_ADMIN_GRPC_ADDR"
	EnvProviderAdminGRPC  = "CONSOLE_PROVIDER_ADMIN_GRPC_ADDR"
	EnvBillingAdminGRPC   = "CONSOLE_BILLING_ADMIN_GRPC_ADDR"
	EnvWorkorderHTTP      = "CONSOLE_WORKORDER_HTTP_URL"
	EnvProviderHTTP       = "CONSOLE_PROVIDER_HTTP_URL"
	EnvBillingHTTP        = "CONSOLE_BILLING_HTTP_URL"
	EnvOperatorToken      = "CONSOLE_OPERATOR_TOKEN"
	EnvReadOpen           = "CONSOLE_READ_OPEN"
	EnvTLSCertFile        = "CONSOLE_TLS_CERT_FILE"
	EnvTLSKeyFile         = "CONSOLE_TLS_KEY_FILE"
	EnvSecureCookies      = "CONSOLE_SECURE_COOKIES"
	EnvRunbookBaseURL     = "CONSOLE_RUNBOOK_BASE_URL"
	EnvRPCTimeout         = "CONSOLE_RPC_TIMEOUT"
	EnvScrapeTimeout      = "CONSOLE_SCRAPE_TIMEOUT"
	EnvShutdownTimeout    = "SHUTDOWN_TIMEOUT"
	EnvLogLevel           = "LOG_LEVEL"
	EnvPprofAddr          = "PPROF_ADDR"
	// The TLS between processes: the names every service reads
	// (libenv.TLS), read here because the console takes nothing else from
	// libenv (its other readers require a database).
	EnvServiceTLSCertFile   = "TLS_CERT_FILE"
	EnvServiceTLSKeyFile    = "TLS_KEY_FILE"
	EnvServiceTLSCAFile     = "TLS_CA_FILE"
	EnvServiceTLSClientAuth = "TLS_CLIENT_AUTH"
	ServiceTLSEnvNames      = "TLS_CERT_FILE / TLS_KEY_FILE / TLS_CA_FILE / TLS_CLIENT_AUTH"
	EnvTraceURL             = "CONSOLE_TRACE_URL"
	EnvOperatorsFile        = "CONSOLE_OPERATORS_FILE"
	EnvSessionTTL           = "CONSOLE_SESSION_TTL"
	EnvSessionIdle          = "CONSOLE_SESSION_IDLE"
	EnvLoginFailures        = "CONSOLE_LOGIN_FAILURES"
	EnvLoginWindow          = "CONSOLE_LOGIN_WINDOW"
	EnvIAPAudience          = "CONSOLE_IAP_AUDIENCE"
	EnvTrustedProxies       = "CONSOLE_TRUSTED_PROXIES"
	DefaultHTTPAddr         = ":8089"
	DefaultRunbookBase      = "https://github.com/lossless-dev/lossless/blob/main/docs/runbooks/"
	DefaultRPCTimeout       = 5 * time.Second
	DefaultScrapeTimeout    = 2 * time.Second
	DefaultShutdown         = 10 * time.Second
	DefaultSessionTTL       = 8 * time.Hour
	DefaultSessionIdle      = 30 * time.Minute
	DefaultLoginFailures    = 10
	DefaultLoginWindow      = 15 * time.Minute
)

// Endpoints of one service the console talks to.
type Endpoints struct {
	// GRPC is the host:port of the service's public gRPC API, dialled with
	// ServiceTLS (TLS when TLS_CA_FILE or TLS_CERT_FILE is set). Unused for
	// provider-sim.
	GRPC string
	// AdminGRPC is the host:port of the service's admin gRPC listener (the
	// operator services), dialled the same way.
	AdminGRPC string
	// HTTP is the base URL of the service's admin HTTP listener (https://
	// when the services serve TLS, verified with ServiceTLS); the console
	// reads <HTTP>/metrics (Prometheus text format) for the Overview's
	// gauges and rates, nothing else.
	HTTP string
}

// Config of the console.
type Config struct {
	// HTTPAddr is the console's listener. Env HTTP_ADDR, default ":8089".
	HTTPAddr string
	// Workorder, Provider and Billing are the services read and acted on.
	// Env CONSOLE_WORKORDER_GRPC_ADDR (default "localhost:9090"),
	// CONSOLE_WORKORDER_ADMIN_GRPC_ADDR ("localhost:9190"),
	// CONSOLE_WORKORDER_HTTP_URL (the admin HTTP listener,
	// "http://localhost:8180"), and the same with BILLING (9092, 9192,
	// 8182) and PROVIDER (only CONSOLE_PROVIDER_ADMIN_GRPC_ADDR, 9191, and
	// _HTTP_URL, 8181): the ports the services' declarations name, so a
	// console started next to `make run` finds them without settings.
	Workorder, Provider, Billing Endpoints
	// OperatorToken is the services' break-glass operator token
	// (WORKORDER_OPERATOR_TOKEN, PROVIDER_OPERATOR_TOKEN,
	// BILLING_OPERATOR_TOKEN). Without OperatorsFile the login form takes
	// it as the one shared credential, with a name the operator types. The
	// console sends it to the services only when it has no identity of
	// its own (AUTH_DISABLED=true, a stack run without authentication);
	// otherwise it calls them with its own ID tokens and the operator's
	// name (CallsAsItself). It never reaches a browser. Env
	// CONSOLE_OPERATOR_TOKEN, default "": without OperatorsFile nobody can
	// log in (fail closed). At least operator.MinTokenLength characters.
	OperatorToken string
	// OperatorsFile lists who may log in, each with their own credential:
	// one line per operator, "name sha256-hex" (the SHA-256 of a random
	// credential of at least operator.MinTokenLength characters; blank and
	// # lines ignored). The audit rows' actor is then the operator's name,
	// and the shared token is no login credential. Re-read when it changes:
	// a removed operator or a changed credential ends the sessions made
	// with the old one. Env CONSOLE_OPERATORS_FILE, default "": log in with
	// a name and the shared OperatorToken (the name is then only as
	// trustworthy as the token, and the actor says "(shared token)").
	// With AUTH_DISABLED=true it needs OperatorToken, which the console
	// then calls the services with.
	OperatorsFile string
	// SessionTTL is a session's absolute lifetime. Env CONSOLE_SESSION_TTL,
	// default 8h.
	SessionTTL time.Duration
	// SessionIdle ends a session unused for that long. Env
	// CONSOLE_SESSION_IDLE, default 30m.
	SessionIdle time.Duration
	// LoginFailures failed logins for one operator name, or from one
	// client address (an IPv6 one by its /64), within LoginWindow lock
	// that name or address out of the login form (429, Retry-After) until
	// the window ends. Env CONSOLE_LOGIN_FAILURES (default 10) and
	// CONSOLE_LOGIN_WINDOW (default 15m).
	LoginFailures int
	LoginWindow   time.Duration
	// TrustedProxies are the load balancers and proxies in front of the
	// console, comma-separated CIDRs or addresses: a request from one of
	// them is counted under the rightmost X-Forwarded-For hop that is not
	// one of them. Env CONSOLE_TRUSTED_PROXIES, default "": none, the
	// client address is the connection's peer (behind a load balancer,
	// every client would share its address and its limit).
	TrustedProxies login.TrustedProxies
	// IAPAudience, when set, puts the console behind Google Cloud
	// Identity-Aware Proxy: every request must carry IAP's signed
	// x-goog-iap-jwt-assertion for this audience (internal/iap), and its
	// e-mail is the session's principal (with OperatorsFile, the operator
	// name whose credential must match). The backend service's audience,
	// "/projects/<project number>/global/backendServices/<id>". Env
	// CONSOLE_IAP_AUDIENCE, default "": no proxy identity.
	IAPAudience string
	// ReadOpen lets anyone who reaches the console see the read-only pages
	// without logging in. Env CONSOLE_READ_OPEN, default false: every page
	// asks for the token first. `make run` sets it (a developer's machine).
	ReadOpen bool
	// TLSCertFile and TLSKeyFile make the console serve HTTPS. Env
	// CONSOLE_TLS_CERT_FILE, CONSOLE_TLS_KEY_FILE, default: TLS_CERT_FILE
	// and TLS_KEY_FILE (ServiceTLS's, as every service serves), else "":
	// plain HTTP, for loopback (`make run`) or behind a TLS-terminating
	// proxy. Both or neither. Reloaded when the files change.
	TLSCertFile, TLSKeyFile string
	// SecureCookies forces the session and CSRF cookies Secure (and
	// __Host- named) on a loopback listener too, e.g. behind a TLS proxy
	// in the same pod. Env CONSOLE_SECURE_COOKIES, default false. The
	// cookies are Secure anyway with TLS or on any listener that is not
	// loopback (see Config.Secure): plain-HTTP cookies are the exception
	// for a console on 127.0.0.1 (`make run`), where nothing else is on the
	// wire.
	SecureCookies bool
	// RunbookBaseURL is prefixed to a runbook's file name (e.g.
	// "outbox-relay-stalled.md") for the Overview's links. Env
	// CONSOLE_RUNBOOK_BASE_URL, default the repository's docs/runbooks/ on
	// GitHub, as the alert rules' runbook_url.
	RunbookBaseURL string
	// RPCTimeout bounds each gRPC call. Env CONSOLE_RPC_TIMEOUT, default 5s:
	// a page shows an error rather than hang on a stuck service.
	RPCTimeout time.Duration
	// ScrapeTimeout bounds each /metrics read. Env CONSOLE_SCRAPE_TIMEOUT,
	// default 2s: below the Overview's 1 s poll period times two, so a slow
	// service shows as unreachable instead of piling up requests.
	ScrapeTimeout time.Duration
	// ShutdownTimeout bounds the graceful stop on SIGTERM. Env
	// SHUTDOWN_TIMEOUT, default 10s.
	ShutdownTimeout time.Duration
	// LogLevel: debug, info, warn or error. Env LOG_LEVEL, default info.
	LogLevel slog.Level
	// TraceURL is the base URL of a trace store's HTTP API
	// (internal/devtools/tracestore: GET <TraceURL>/v1/orders/{id}); an order's page
	// then shows its spans as a waterfall. Env CONSOLE_TRACE_URL, default "":
	// no trace section, the page points to Jaeger and `make trace` instead,
	// because a deployment's tracing backend (Jaeger, Cloud Trace) has no
	// per-order query. `make run` sets it to its trace store's address.
	TraceURL string
	// PprofAddr serves /debug/pprof/ on a loopback listener of its own, as
	// the other services do (the benchmarks profile every process). Env
	// PPROF_ADDR, default "": off; profiles show internals and have no
	// authentication, so only a loopback address is accepted.
	PprofAddr string
	// ServiceTLS is the console's side of the TLS between processes (env
	// TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE, TLS_CLIENT_AUTH): the CA it
	// verifies the services' gRPC and /metrics listeners with, and the
	// certificate it presents to services that require one (mTLS). Default:
	// plaintext. Separate from CONSOLE_TLS_CERT_FILE, the certificate
	// browsers see.
	ServiceTLS server.TLSConfig
	// WorkorderAuth, BillingAuth and ProviderAuth are the console's ID
	// tokens for each service's audience: WORKORDER_AUDIENCE (default
	// "workorder"), BILLING_AUDIENCE ("billing") and PROVIDER_AUDIENCE
	// ("provider-sim"), with AUTH_TOKEN_URL, AUTH_CLIENT_ID,
	// AUTH_CLIENT_SECRET (unset: Google ID tokens of the workload's service
	// account) and AUTH_DISABLED; see internal/clientauth. The console sends
	// them on every call to the public APIs it reads (orders, invoices:
	// it lists every order, so its subject must be in workorder's
	// WORKORDER_OPERATOR_SUBJECTS and AUTH_CLIENTS), and on a logged-in
	// operator's calls to the operator services with the operator's name
	// in x-lossless-operator (pkg/operator.OperatorHeader), which the
	// services admit because they list the console in AUTH_CONSOLES.
	WorkorderAuth clientauth.Config
	BillingAuth   clientauth.Config
	ProviderAuth  clientauth.Config
}

// FromEnv reads the configuration from r, fills defaults and validates it;
// errors name the variable.
func FromEnv(r *envconfig.Reader) (Config, error) {
	c := Config{
		HTTPAddr: r.String(EnvHTTPAddr, ""),
		Workorder: Endpoints{GRPC: r.String(EnvWorkorderGRPC, ""), AdminGRPC: r.String(EnvWorkorderAdminGRPC, ""),
			HTTP: r.String(EnvWorkorderHTTP, "")},
		Provider: Endpoints{AdminGRPC: r.String(EnvProviderAdminGRPC, ""), HTTP: r.String(EnvProviderHTTP, "")},
		Billing: Endpoints{GRPC: r.String(EnvBillingGRPC, ""), AdminGRPC: r.String(EnvBillingAdminGRPC, ""),
			HTTP: r.String(EnvBillingHTTP, "")},
		OperatorToken:   r.String(EnvOperatorToken, ""),
		ReadOpen:        r.Bool(EnvReadOpen, false),
		TLSCertFile:     r.String(EnvTLSCertFile, ""),
		TLSKeyFile:      r.String(EnvTLSKeyFile, ""),
		SecureCookies:   r.Bool(EnvSecureCookies, false),
		RunbookBaseURL:  r.String(EnvRunbookBaseURL, ""),
		RPCTimeout:      r.Duration(EnvRPCTimeout, 0),
		ScrapeTimeout:   r.Duration(EnvScrapeTimeout, 0),
		ShutdownTimeout: r.Duration(EnvShutdownTimeout, 0),
		PprofAddr:       r.String(EnvPprofAddr, ""),
		ServiceTLS: server.TLSConfig{
			CertFile:   r.String(EnvServiceTLSCertFile, ""),
			KeyFile:    r.String(EnvServiceTLSKeyFile, ""),
			CAFile:     r.String(EnvServiceTLSCAFile, ""),
			ClientAuth: server.ClientAuth(r.String(EnvServiceTLSClientAuth, "")),
		},
		TraceURL:      r.String(EnvTraceURL, ""),
		OperatorsFile: r.String(EnvOperatorsFile, ""),
		SessionTTL:    r.Duration(EnvSessionTTL, 0),
		SessionIdle:   r.Duration(EnvSessionIdle, 0),
		LoginFailures: r.Int(EnvLoginFailures, 0),
		LoginWindow:   r.Duration(EnvLoginWindow, 0),
		IAPAudience:   r.String(EnvIAPAudience, ""),
		WorkorderAuth: clientauth.FromEnv(r, "WORKORDER_AUDIENCE", "workorder"),
		BillingAuth:   clientauth.FromEnv(r, "BILLING_AUDIENCE", "billing"),
		ProviderAuth:  clientauth.FromEnv(r, "PROVIDER_AUDIENCE", "provider-sim"),
	}
	if tp, err := login.ParseTrustedProxies(r.String(EnvTrustedProxies, "")); err != nil {
		r.Record(fmt.Errorf("%s: %w", EnvTrustedProxies, err))
	} else {
		c.TrustedProxies = tp
	}
	if _, ok := r.Lookup("PPROF_ENABLED"); ok {
		r.Record(fmt.Errorf("PPROF_ENABLED is gone: set %s to a loopback address (e.g. 127.0.0.1:6069)", EnvPprofAddr))
	}
	if _, ok := r.Lookup("CONSOLE_PROVIDER_GRPC_ADDR"); ok {
		r.Record(fmt.Errorf("CONSOLE_PROVIDER_GRPC_ADDR is gone: the console calls only provider-sim's admin services; set %s (its ADMIN_GRPC_ADDR)", EnvProviderAdminGRPC))
	}
	if c.TLSCertFile == "" && c.TLSKeyFile == "" {
		c.TLSCertFile, c.TLSKeyFile = c.ServiceTLS.CertFile, c.ServiceTLS.KeyFile
	}
	if lv := r.String(EnvLogLevel, ""); lv != "" {
		if err := c.LogLevel.UnmarshalText([]byte(lv)); err != nil {
			return Config{}, errors.Join(r.Err(), fmt.Errorf("%s=%q: want debug, info, warn or error", EnvLogLevel, lv))
		}
	}
	if err := r.Err(); err != nil {
		return Config{}, err
	}
	c.setDefaults()
	return c, c.Validate()
}

// setDefaults fills every zero field with its default.
func (c *Config) setDefaults() {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&c.HTTPAddr, DefaultHTTPAddr)
	def(&c.Workorder.GRPC, "localhost:9090")
	def(&c.Billing.GRPC, "localhost:9092")
	def(&c.Workorder.AdminGRPC, "localhost:9190")
	def(&c.Provider.AdminGRPC, "localhost:9191")
	def(&c.Billing.AdminGRPC, "localhost:9192")
	def(&c.Workorder.HTTP, "http://localhost:8180")
	def(&c.Provider.HTTP, "http://localhost:8181")
	def(&c.Billing.HTTP, "http://localhost:8182")
	def(&c.RunbookBaseURL, DefaultRunbookBase)
	if c.RPCTimeout == 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = DefaultScrapeTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdown
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	if c.LoginFailures == 0 {
		c.LoginFailures = DefaultLoginFailures
	}
	if c.LoginWindow == 0 {
		c.LoginWindow = DefaultLoginWindow
	}
}

// Validate checks the settings; each error names its variable.
func (c Config) Validate() error {
	errs := []error{c.WorkorderAuth.Validate(), c.BillingAuth.Validate(), c.ProviderAuth.Validate()}
	for name, u := range map[string]string{
		EnvWorkorderHTTP: c.Workorder.HTTP, EnvProviderHTTP: c.Provider.HTTP, EnvBillingHTTP: c.Billing.HTTP,
		EnvRunbookBaseURL: c.RunbookBaseURL,
	} {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want an absolute http:// or https:// URL", name, u))
		}
	}
	if c.TraceURL != "" {
		if p, err := url.Parse(c.TraceURL); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want an absolute http:// or https:// URL, or empty for no traces", EnvTraceURL, c.TraceURL))
		}
	}
	for name, a := range map[string]string{
		EnvWorkorderGRPC: c.Workorder.GRPC, EnvBillingGRPC: c.Billing.GRPC,
		EnvWorkorderAdminGRPC: c.Workorder.AdminGRPC, EnvProviderAdminGRPC: c.Provider.AdminGRPC, EnvBillingAdminGRPC: c.Billing.AdminGRPC,
	} {
		if a == "" {
			errs = append(errs, fmt.Errorf("%s: want host:port", name))
		}
	}
	errs = append(errs, operator.ValidateToken(EnvOperatorToken, c.OperatorToken))
	if c.PprofAddr != "" {
		if err := server.ValidateLoopback(c.PprofAddr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvPprofAddr, err))
		}
	}
	if err := c.ServiceTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", ServiceTLSEnvNames, err))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, fmt.Errorf("%s and %s: set both or neither", EnvTLSCertFile, EnvTLSKeyFile))
	}
	for name, d := range map[string]time.Duration{EnvRPCTimeout: c.RPCTimeout, EnvScrapeTimeout: c.ScrapeTimeout, EnvShutdownTimeout: c.ShutdownTimeout,
		EnvSessionTTL: c.SessionTTL, EnvSessionIdle: c.SessionIdle, EnvLoginWindow: c.LoginWindow} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s=%s: must not be negative", name, d))
		}
	}
	if c.LoginFailures < 0 {
		errs = append(errs, fmt.Errorf("%s=%d: must not be negative", EnvLoginFailures, c.LoginFailures))
	}
	if c.IAPAudience != "" && !strings.HasPrefix(c.IAPAudience, "/projects/") {
		errs = append(errs, fmt.Errorf("%s=%q: want /projects/<project number>/global/backendServices/<id>", EnvIAPAudience, c.IAPAudience))
	}
	if c.OperatorsFile != "" && c.OperatorToken == "" && !c.CallsAsItself() {
		errs = append(errs, fmt.Errorf("%s is set but %s is not: with AUTH_DISABLED=true the console calls the services with the operator token", EnvOperatorsFile, EnvOperatorToken))
	}
	return errors.Join(errs...)
}

// CallsAsItself reports whether the console calls the operator services
// with its own ID tokens and the logged-in operator's name (recorded as
// "console:<console>/<operator>"), rather than with the break-glass
// OperatorToken: whenever it has an identity, i.e. AUTH_DISABLED is not
// true (docs/adr/0025-authorization.md).
func (c Config) CallsAsItself() bool { return !c.WorkorderAuth.Disabled }

// TLS reports whether the console serves HTTPS itself.
func (c Config) TLS() bool { return c.TLSCertFile != "" }

// Secure reports whether the cookies are Secure (and __Host- named): with
// TLS, with SecureCookies, and whenever HTTPAddr is not a loopback address
// (":8089" listens on every interface). Only a console reached on loopback
// over plain HTTP keeps plain cookies, which a browser would otherwise drop
// on http://127.0.0.1.
func (c Config) Secure() bool {
	return c.TLS() || c.SecureCookies || !loopback(c.HTTPAddr)
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
