// Package config is the console's configuration, read from the environment.
// Every variable, its default and its reason are documented on the field it
// fills; a bad value stops the process at start-up with an error naming the
// variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// ServiceName is the console's name in logs and metrics.
const ServiceName = "console"

// Environment variables read by FromEnv.
const (
	EnvHTTPAddr          = "HTTP_ADDR"
	EnvWorkorderGRPC     = "CONSOLE_WORKORDER_GRPC_ADDR"
	EnvProviderGRPC      = "CONSOLE_PROVIDER_GRPC_ADDR"
	EnvBillingGRPC       = "CONSOLE_BILLING_GRPC_ADDR"
	EnvWorkorderHTTP     = "CONSOLE_WORKORDER_HTTP_URL"
	EnvProviderHTTP      = "CONSOLE_PROVIDER_HTTP_URL"
	EnvBillingHTTP       = "CONSOLE_BILLING_HTTP_URL"
	EnvOperatorToken     = "CONSOLE_OPERATOR_TOKEN"
	EnvReadOpen          = "CONSOLE_READ_OPEN"
	EnvTLSCertFile       = "CONSOLE_TLS_CERT_FILE"
	EnvTLSKeyFile        = "CONSOLE_TLS_KEY_FILE"
	EnvSecureCookies     = "CONSOLE_SECURE_COOKIES"
	EnvRunbookBaseURL    = "CONSOLE_RUNBOOK_BASE_URL"
	EnvRPCTimeout        = "CONSOLE_RPC_TIMEOUT"
	EnvScrapeTimeout     = "CONSOLE_SCRAPE_TIMEOUT"
	EnvShutdownTimeout   = "SHUTDOWN_TIMEOUT"
	EnvLogLevel          = "LOG_LEVEL"
	EnvPprofEnabled      = "PPROF_ENABLED"
	EnvTraceURL          = "CONSOLE_TRACE_URL"
	DefaultHTTPAddr      = ":8089"
	DefaultRunbookBase   = "https://github.com/lossless-dev/lossless/blob/main/docs/runbooks/"
	DefaultRPCTimeout    = 5 * time.Second
	DefaultScrapeTimeout = 2 * time.Second
	DefaultShutdown      = 10 * time.Second
)

// Endpoints of one service the console talks to.
type Endpoints struct {
	// GRPC is the host:port of the service's gRPC API (plaintext, like
	// every service-to-service call of the system).
	GRPC string
	// HTTP is the base URL of the service's HTTP listener; the console reads
	// <HTTP>/metrics (Prometheus text format) for the Overview's gauges and
	// rates, nothing else.
	HTTP string
}

// Config of the console.
type Config struct {
	// HTTPAddr is the console's listener. Env HTTP_ADDR, default ":8089".
	HTTPAddr string
	// Workorder, Provider and Billing are the services read and acted on.
	// Env CONSOLE_WORKORDER_GRPC_ADDR (default "localhost:9090"),
	// CONSOLE_WORKORDER_HTTP_URL ("http://localhost:8080"), and the same
	// with PROVIDER (9091, 8081) and BILLING (9092, 8082): the ports the
	// services' declarations name, so a console started next to `make run`
	// finds them without settings.
	Workorder, Provider, Billing Endpoints
	// OperatorToken is the operator token of the services
	// (WORKORDER_OPERATOR_TOKEN, PROVIDER_OPERATOR_TOKEN). The login form
	// accepts exactly this token; the console forwards it as
	// "authorization: Bearer" on the calls a logged-in operator makes, so the
	// services still decide. Env CONSOLE_OPERATOR_TOKEN, default "": nobody
	// can log in (fail closed). At least operator.MinTokenLength characters.
	OperatorToken string
	// ReadOpen lets anyone who reaches the console see the read-only pages
	// without logging in. Env CONSOLE_READ_OPEN, default false: every page
	// asks for the token first. `make run` sets it (a developer's machine).
	ReadOpen bool
	// TLSCertFile and TLSKeyFile make the console serve HTTPS. Env
	// CONSOLE_TLS_CERT_FILE, CONSOLE_TLS_KEY_FILE, default "": plain HTTP,
	// for loopback (`make run`) or behind a TLS-terminating proxy. Both or
	// neither.
	TLSCertFile, TLSKeyFile string
	// SecureCookies marks the session and CSRF cookies Secure although the
	// console itself serves plain HTTP (a TLS-terminating proxy in front).
	// Env CONSOLE_SECURE_COOKIES, default false. With TLS the cookies are
	// always Secure. Plain HTTP without it is the local exception: a
	// browser does not send Secure cookies over http://, so `make run` could
	// not log in.
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
	// (internal/tracestore: GET <TraceURL>/v1/orders/{id}); an order's page
	// then shows its spans as a waterfall. Env CONSOLE_TRACE_URL, default "":
	// no trace section, the page points to Jaeger and `make trace` instead,
	// because a deployment's tracing backend (Jaeger, Cloud Trace) has no
	// per-order query. `make run` sets it to its trace store's address.
	TraceURL string
	// PprofEnabled serves /debug/pprof/ on the HTTP listener, as the other
	// services do (the benchmarks profile every process). Env PPROF_ENABLED,
	// default false: profiles show internals.
	PprofEnabled bool
	// WorkorderAuth and BillingAuth are the console's ID tokens for the
	// public APIs it reads (orders, invoices): WORKORDER_AUDIENCE (default
	// "workorder") and BILLING_AUDIENCE (default "billing"), with
	// AUTH_TOKEN_URL, AUTH_CLIENT_ID, AUTH_CLIENT_SECRET (unset: Google ID
	// tokens of the workload's service account) and AUTH_DISABLED; see
	// internal/clientauth. The console lists every order: its subject must
	// be one of the work-order service's WORKORDER_OPERATOR_SUBJECTS.
	WorkorderAuth clientauth.Config
	BillingAuth   clientauth.Config
}

// FromEnv reads the configuration from r, fills defaults and validates it;
// errors name the variable.
func FromEnv(r *envconfig.Reader) (Config, error) {
	c := Config{
		HTTPAddr:        r.String(EnvHTTPAddr, ""),
		Workorder:       Endpoints{GRPC: r.String(EnvWorkorderGRPC, ""), HTTP: r.String(EnvWorkorderHTTP, "")},
		Provider:        Endpoints{GRPC: r.String(EnvProviderGRPC, ""), HTTP: r.String(EnvProviderHTTP, "")},
		Billing:         Endpoints{GRPC: r.String(EnvBillingGRPC, ""), HTTP: r.String(EnvBillingHTTP, "")},
		OperatorToken:   r.String(EnvOperatorToken, ""),
		ReadOpen:        r.Bool(EnvReadOpen, false),
		TLSCertFile:     r.String(EnvTLSCertFile, ""),
		TLSKeyFile:      r.String(EnvTLSKeyFile, ""),
		SecureCookies:   r.Bool(EnvSecureCookies, false),
		RunbookBaseURL:  r.String(EnvRunbookBaseURL, ""),
		RPCTimeout:      r.Duration(EnvRPCTimeout, 0),
		ScrapeTimeout:   r.Duration(EnvScrapeTimeout, 0),
		ShutdownTimeout: r.Duration(EnvShutdownTimeout, 0),
		PprofEnabled:    r.Bool(EnvPprofEnabled, false),
		TraceURL:        r.String(EnvTraceURL, ""),
		WorkorderAuth:   clientauth.FromEnv(r, "WORKORDER_AUDIENCE", "workorder"),
		BillingAuth:     clientauth.FromEnv(r, "BILLING_AUDIENCE", "billing"),
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
	def(&c.Provider.GRPC, "localhost:9091")
	def(&c.Billing.GRPC, "localhost:9092")
	def(&c.Workorder.HTTP, "http://localhost:8080")
	def(&c.Provider.HTTP, "http://localhost:8081")
	def(&c.Billing.HTTP, "http://localhost:8082")
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
}

// Validate checks the settings; each error names its variable.
func (c Config) Validate() error {
	errs := []error{c.WorkorderAuth.Validate(), c.BillingAuth.Validate()}
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
	for name, a := range map[string]string{EnvWorkorderGRPC: c.Workorder.GRPC, EnvProviderGRPC: c.Provider.GRPC, EnvBillingGRPC: c.Billing.GRPC} {
		if a == "" {
			errs = append(errs, fmt.Errorf("%s: want host:port", name))
		}
	}
	errs = append(errs, operator.ValidateToken(EnvOperatorToken, c.OperatorToken))
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, fmt.Errorf("%s and %s: set both or neither", EnvTLSCertFile, EnvTLSKeyFile))
	}
	for name, d := range map[string]time.Duration{EnvRPCTimeout: c.RPCTimeout, EnvScrapeTimeout: c.ScrapeTimeout, EnvShutdownTimeout: c.ShutdownTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s=%s: must not be negative", name, d))
		}
	}
	return errors.Join(errs...)
}

// TLS reports whether the console serves HTTPS itself.
func (c Config) TLS() bool { return c.TLSCertFile != "" }
