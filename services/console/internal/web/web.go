// Package web is the console's HTTP surface: server-rendered pages
// (html/template, embedded), a little JavaScript for the live parts,
// login into server-side sessions and CSRF bound to them on every form
// (ADR 0019). It reads and acts only through the services' gRPC APIs
// (Sources) and their /metrics.
package web

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/services/console/internal/login"
	sessions "github.com/lossless-dev/lossless/services/console/internal/session"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config of the pages.
type Config struct {
	// OperatorToken is the services' break-glass operator token
	// (config.Config.OperatorToken): without Operators the login form
	// takes it as the shared credential. Neither: nobody can log in. The
	// pages never send it; the operator services' connections carry the
	// console's credential (package app).
	OperatorToken string
	// Operators, when set, are the operators who may log in, each with their
	// own credential (config.Config.OperatorsFile); the shared token is
	// then not a login credential.
	Operators *login.File
	// Identity, when set, verifies the identity-aware proxy's assertion
	// on every request: it is the session's principal, and a session whose
	// request no longer carries it is void.
	Identity IdentityVerifier
	// Sessions bounds the sessions (lifetime, idle timeout, count).
	Sessions sessions.Config
	// LoginLimit bounds failed logins per operator name and per client
	// address.
	LoginLimit login.LimitConfig
	// TrustedProxies are the proxies whose X-Forwarded-For names the
	// client address the login limit counts (config.Config.TrustedProxies).
	// Zero: none, the client is the connection's peer.
	TrustedProxies login.TrustedProxies
	// ReadOpen shows the read-only pages without login.
	ReadOpen bool
	// SecureCookies marks the cookies Secure and names them with the
	// __Host- prefix (TLS here or at a proxy; false only on loopback).
	SecureCookies bool
	// RunbookBaseURL prefixes the runbooks' file names. Required.
	RunbookBaseURL string
	// RPCTimeout bounds each call to a service, and the trace store's
	// answer. Default 5s.
	RPCTimeout time.Duration
	// TraceURL is the trace store's HTTP API (config.Config.TraceURL).
	// Empty: the order page has no waterfall, only where to look instead.
	TraceURL string
}

func (c *Config) setDefaults() {
	if c.RPCTimeout == 0 {
		c.RPCTimeout = 5 * time.Second
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.RunbookBaseURL == "" {
		return errors.New("web: RunbookBaseURL is required")
	}
	if c.RPCTimeout < 0 {
		return errors.New("web: RPCTimeout must not be negative")
	}
	return nil
}

// Handler serves the console.
type Handler struct {
	cfg    Config
	src    Sources
	logger *slog.Logger
	auth   *auth
	pages  map[string]*template.Template
	mux    *http.ServeMux
}

// New returns the console's handler.
func New(src Sources, cfg Config, logger *slog.Logger) (*Handler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src.Orders == nil || src.Inbox == nil || src.BillingRepairs == nil || src.WorkOrderOps == nil || src.BillingOps == nil || src.ProviderAudit == nil || src.Faults == nil || src.Invoices == nil || src.Figures == nil || logger == nil {
		return nil, errors.New("web: New needs every source and a logger")
	}
	if src.Outbox == nil || src.ProviderJobs == nil || src.InvoiceJobs == nil {
		return nil, errors.New("web: New needs the Order page's sources (Outbox, ProviderJobs, InvoiceJobs)")
	}
	a, err := newAuth(cfg, logger)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, src: src, logger: logger, auth: a, pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	for _, p := range []string{"overview", "orders", "order", "faults", "repair", "audit", "login"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", p, err)
		}
		h.pages[p] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /login", h.loginPage)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /logout", h.logout)
	h.mux.HandleFunc("GET /{$}", h.read(h.overviewPage))
	h.mux.HandleFunc("GET /api/overview", h.readAPI(h.overviewAPI))
	h.mux.HandleFunc("GET /orders", h.read(h.ordersPage))
	h.mux.HandleFunc("GET /orders/{id}", h.read(h.orderPage))
	h.mux.HandleFunc("GET /api/orders/{id}", h.readAPI(h.orderAPI))
	h.mux.HandleFunc("GET /faults", h.read(h.faultsPage))
	h.mux.HandleFunc("POST /faults", h.act(h.updateFaults))
	h.mux.HandleFunc("POST /faults/demo", h.act(h.runDemo))
	h.mux.HandleFunc("GET /repair", h.read(h.repairPage))
	h.mux.HandleFunc("POST /repair/replay", h.act(h.replay))
	h.mux.HandleFunc("POST /repair/dead-letters", h.act(h.replayDeadLetters))
	h.mux.HandleFunc("POST /repair/parked", h.act(h.replayParked))
	h.mux.HandleFunc("POST /repair/jobs", h.act(h.retryJobs))
	h.mux.HandleFunc("POST /repair/outbox", h.act(h.requeueOutbox))
	h.mux.HandleFunc("GET /audit", h.read(h.auditPage))
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// No inline script or style: everything comes from /static.
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if !strings.HasPrefix(r.URL.Path, "/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	h.auth.middleware(h.mux).ServeHTTP(w, r)
}

// read guards a read-only page: open with ReadOpen, else login first.
func (h *Handler) read(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.auth.canRead(r) {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(safeNext(r.URL.RequestURI())), http.StatusSeeOther)
			return
		}
		fn(w, r)
	}
}

func (h *Handler) readAPI(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.auth.canRead(r) {
			http.Error(w, `{"error":"log in first"}`, http.StatusUnauthorized)
			return
		}
		fn(w, r)
	}
}

// act guards a mutating action: login always (CSRF was checked before).
func (h *Handler) act(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sessionOf(r).LoggedIn {
			w.WriteHeader(http.StatusUnauthorized)
			h.render(w, r, "login", page{Title: "Log in", Error: "This action needs a login first.", Data: h.loginData("/")})
			return
		}
		fn(w, r)
	}
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Session  session
	ReadOpen bool
	Flash    string
	Error    string
	Data     any
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, name string, p page) {
	p.Session = sessionOf(r)
	p.ReadOpen = h.cfg.ReadOpen
	if p.Nav == "" {
		p.Nav = name
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := h.pages[name].ExecuteTemplate(w, "layout.html", p); err != nil {
		h.logger.ErrorContext(r.Context(), "console: render", "page", name, "error", err.Error())
	}
}

// describe turns a service's error into a sentence for the page; never the
// request's token (the services do not echo it).
func describe(service string, err error) string {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unauthenticated, codes.PermissionDenied:
		return service + " refused the call: " + st.Message() + ". Log in as an operator."
	case codes.Unavailable, codes.DeadlineExceeded:
		return service + " is unreachable or slow (" + st.Code().String() + "): " + st.Message()
	case codes.NotFound:
		return service + ": not found"
	}
	return service + ": " + st.Code().String() + ": " + st.Message()
}

// safeNext returns s when it is a path on this site, else "/". Browsers
// strip tabs and newlines from a URL and read a backslash as a slash, so
// "/\t/evil.example" goes to another host: any control character,
// backslash or non-ASCII byte is refused, and what remains must parse as a
// path that does not start with "//".
func safeNext(s string) string {
	if s == "" || len(s) > 2000 || strings.ContainsFunc(s, func(r rune) bool { return r <= 0x20 || r >= 0x7f || r == '\\' }) {
		return "/"
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return (&url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}).RequestURI()
}

var funcs = template.FuncMap{
	"ts": func(t *timestamppb.Timestamp) string {
		if t == nil {
			return ""
		}
		return t.AsTime().UTC().Format("2006-01-02 15:04:05.000Z")
	},
}
