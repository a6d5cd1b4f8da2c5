package web_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/console/internal/overview"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

const token = "0123456789abcdef0123456789abcdef-console-test"

// backend is a gRPC server standing in for provider-sim's knobs and
// workorder's create, guarded by the same operator guard as the real ones: the
// console's requests travel the real client, metadata and guard. Like
// provider-sim, it refuses a change of the knobs without an authorization
// and records each change as an operator_audit row (providerAudit lists
// them).
type backend struct {
	providerv1.UnimplementedProviderAdminServiceServer
	workorderv1.UnimplementedWorkOrderServiceServer
	mu      sync.Mutex
	faults  *providerv1.Faults
	created int
	audit   []*opsv1.OperatorAuditRecord
}

func (b *backend) GetFaults(context.Context, *providerv1.GetFaultsRequest) (*providerv1.GetFaultsResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &providerv1.GetFaultsResponse{Faults: proto.Clone(b.faults).(*providerv1.Faults)}, nil
}

func (b *backend) UpdateFaults(_ context.Context, req *providerv1.UpdateFaultsRequest) (*providerv1.UpdateFaultsResponse, error) {
	a := req.GetAuthorization()
	if vs := operator.AuthorizationViolations("authorization.", a.GetTicket(), a.GetActor()); len(vs) > 0 {
		return nil, apierror.InvalidArgument(vs...)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	params, err := structpb.NewStruct(map[string]any{"before": map[string]any{"duplicate": b.faults.GetDuplicate()},
		"after": map[string]any{"duplicate": req.GetFaults().GetDuplicate()}})
	if err != nil {
		return nil, err
	}
	b.audit = append([]*opsv1.OperatorAuditRecord{{Id: int64(len(b.audit) + 1), Action: "faults.update", Actor: a.GetActor(),
		Ticket: a.GetTicket(), Affected: 1, Params: params}}, b.audit...)
	b.faults = req.GetFaults()
	return &providerv1.UpdateFaultsResponse{Faults: b.faults}, nil
}

// providerAudit is the backend's OperatorService: provider-sim mounts only
// ListOperatorAudit.
type providerAudit struct {
	opsv1.UnimplementedOperatorServiceServer
	b *backend
}

func (p providerAudit) ListOperatorAudit(context.Context, *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	return &opsv1.ListOperatorAuditResponse{Records: p.b.audit}, nil
}

func (b *backend) CreateWorkOrder(_ context.Context, req *workorderv1.CreateWorkOrderRequest) (*workorderv1.CreateWorkOrderResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.created++
	return &workorderv1.CreateWorkOrderResponse{WorkOrder: req.GetWorkOrder()}, nil
}

func (b *backend) state() (duplicate float64, created int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.faults.GetDuplicate(), b.created
}

type noFigures struct{}

func (noFigures) Read(context.Context) (overview.Figures, error) { return overview.Figures{}, nil }

// console starts the backend and the console in front of it; register
// adds more services to the backend's servers: wo stands for the workorder
// service, bi for billing (each service has its own OperatorService);
// provider-sim's (the backend's knobs and audit) has a server of its own.
func console(t *testing.T, cfg web.Config, register ...func(wo, bi *grpc.Server)) (*backend, *httptest.Server) {
	t.Helper()
	return consoleLogging(t, cfg, slog.New(slog.DiscardHandler), register...)
}

// consoleLogging is console with the console's log going to logger.
func consoleLogging(t *testing.T, cfg web.Config, logger *slog.Logger, register ...func(wo, bi *grpc.Server)) (*backend, *httptest.Server) {
	t.Helper()
	b := &backend{faults: &providerv1.Faults{}}
	guard, err := operator.NewGuard(token, "TEST_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(guard.Interceptor(workorderv1.WorkOrderService_CreateWorkOrder_FullMethodName)))
	workorderv1.RegisterWorkOrderServiceServer(srv, b)
	prSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		guard.Interceptor(providerv1.ProviderAdminService_UpdateFaults_FullMethodName),
		guard.ServiceInterceptor(opsv1.OperatorService_ServiceDesc.ServiceName)))
	providerv1.RegisterProviderAdminServiceServer(prSrv, b)
	opsv1.RegisterOperatorServiceServer(prSrv, providerAudit{b: b})
	biSrv := grpc.NewServer()
	for _, reg := range register {
		reg(srv, biSrv)
	}
	// As the console dials the operator services when it has no identity
	// of its own (package app): a logged-in session's calls carry the
	// break-glass token the backends' guard checks.
	asOperator := operator.ConsoleDialOptions(nil, token)
	conn, pr, bi := serve(t, srv, asOperator...), serve(t, prSrv, asOperator...), serve(t, biSrv, asOperator...)
	cfg.RunbookBaseURL = "https://example.invalid/docs/runbooks/"
	h, err := web.New(web.Sources{
		Orders:         workorderv1.NewWorkOrderServiceClient(conn),
		Inbox:          opsv1.NewOperatorServiceClient(conn),
		BillingRepairs: opsv1.NewOperatorServiceClient(bi),
		WorkOrderOps:   opsv1.NewOperatorServiceClient(conn),
		BillingOps:     opsv1.NewOperatorServiceClient(bi),
		ProviderAudit:  opsv1.NewOperatorServiceClient(pr),
		Faults:         providerv1.NewProviderAdminServiceClient(pr),
		Invoices:       billingv1.NewBillingServiceClient(bi),
		Figures:        noFigures{},
		// The Order page's timeline (order_test.go).
		Outbox:       opsv1.NewOperatorServiceClient(conn),
		ProviderJobs: providerv1.NewProviderAdminServiceClient(pr),
		InvoiceJobs:  opsv1.NewOperatorServiceClient(bi),
	}, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return b, ts
}

// serve serves srv on a local port until the test ends and returns a
// client connection to it.
func serve(t *testing.T, srv *grpc.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// browser is a client with a cookie jar that records every response, so a
// test can check the token never comes back.
type browser struct {
	t      *testing.T
	base   string
	client *http.Client
	seen   []string    // bodies, Location headers, request URLs
	header http.Header // added to every request (an identity proxy's)
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, client: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) do(method, path string, form url.Values) (int, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range b.header {
		req.Header[k] = v
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	b.seen = append(b.seen, req.URL.String(), string(raw), resp.Header.Get("Location"))
	return resp.StatusCode, string(raw), resp.Header
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf loads a page and returns its forms' CSRF value.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	code, body, _ := b.do(http.MethodGet, path, nil)
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		b.t.Fatalf("GET %s: %d, no CSRF field in the page", path, code)
	}
	return m[1]
}

func (b *browser) login(tok string) int {
	b.t.Helper()
	code, _, _ := b.do(http.MethodPost, "/login", url.Values{"csrf": {b.csrf("/login")}, "operator": {"alice"}, "token": {tok}, "next": {"/faults"}})
	return code
}

func faultsForm(csrf string) url.Values {
	return url.Values{"csrf": {csrf}, "ticket": {"CHG-1"}, "duplicate": {"0.5"}, "early_completion": {"0"}, "split_completion": {"0"},
		"poison": {"0"}, "unknown_order": {"0"}, "publish_then_crash": {"0"}, "accept_timeout": {"0"},
		"extra_delay": {"0s"}, "accept_latency_p50": {"0s"}, "accept_latency_p99": {"0s"}, "seed": {"7"}}
}

func TestMutatingActions_RefusedWithoutCSRFOrLogin_ChangeNothing(t *testing.T) {
	b, ts := console(t, web.Config{OperatorToken: token, ReadOpen: true})
	br := newBrowser(t, ts.URL)
	csrf := br.csrf("/faults")

	// Not logged in, CSRF right: refused, the service is never called.
	if code, _, _ := br.do(http.MethodPost, "/faults", faultsForm(csrf)); code != http.StatusUnauthorized {
		t.Errorf("update without login: %d, want 401", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/faults/demo", url.Values{"csrf": {csrf}, "orders": {"3"}}); code != http.StatusUnauthorized {
		t.Errorf("demo without login: %d, want 401", code)
	}

	if code := br.login(token); code != http.StatusSeeOther {
		t.Fatalf("login: %d, want 303", code)
	}
	// Logged in, CSRF missing, wrong, from before login, or from another
	// session: 403.
	before := csrf
	csrf = br.csrf("/faults")
	for name, v := range map[string]string{"missing": "", "wrong": flip(csrf), "pre-login": before, "another session's": newBrowser(t, ts.URL).csrf("/faults")} {
		form := faultsForm(v)
		if v == "" {
			form.Del("csrf")
		}
		if code, _, _ := br.do(http.MethodPost, "/faults", form); code != http.StatusForbidden {
			t.Errorf("update with %s CSRF token: %d, want 403", name, code)
		}
		demo := url.Values{"csrf": {v}, "orders": {"3"}}
		if code, _, _ := br.do(http.MethodPost, "/faults/demo", demo); code != http.StatusForbidden {
			t.Errorf("demo with %s CSRF token: %d, want 403", name, code)
		}
	}
	if dup, created := b.state(); dup != 0 || created != 0 {
		t.Fatalf("after refused requests: duplicate %v, %d orders created; want nothing changed", dup, created)
	}

	// The same requests with the page's token go through, with the operator
	// token forwarded (the backend's guard would refuse them otherwise).
	if code, _, hd := br.do(http.MethodPost, "/faults", faultsForm(csrf)); code != http.StatusSeeOther || hd.Get("Location") != "/faults?done=updated" {
		t.Fatalf("update logged in: %d %q, want 303 to /faults?done=updated", code, hd.Get("Location"))
	}
	if code, _, _ := br.do(http.MethodPost, "/faults/demo", url.Values{"csrf": {csrf}, "orders": {"3"}}); code != http.StatusSeeOther {
		t.Fatalf("demo logged in: %d, want 303", code)
	}
	if dup, created := b.state(); dup != 0.5 || created != 3 {
		t.Fatalf("after accepted requests: duplicate %v, %d orders; want 0.5 and 3", dup, created)
	}
	// Logged out: refused again.
	if code, _, _ := br.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	// The session's CSRF value ended with it; a fresh one is anonymous.
	if code, _, _ := br.do(http.MethodPost, "/faults/demo", url.Values{"csrf": {csrf}, "orders": {"3"}}); code != http.StatusForbidden {
		t.Errorf("demo after logout with the session's CSRF value: %d, want 403", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/faults/demo", url.Values{"csrf": {br.csrf("/faults")}, "orders": {"3"}}); code != http.StatusUnauthorized {
		t.Errorf("demo after logout: %d, want 401", code)
	}
	if _, created := b.state(); created != 3 {
		t.Fatalf("%d orders after logout's refusal, want 3", created)
	}
	assertNoToken(t, br)
}

func TestLogin_TokenNeverInABodyOrURLAndCookieIsLockedDown(t *testing.T) {
	_, ts := console(t, web.Config{OperatorToken: token, ReadOpen: false})
	br := newBrowser(t, ts.URL)
	wrong := token + "-wrong"
	if code := br.login(wrong); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d, want 401", code)
	}
	code, _, hd := br.do(http.MethodPost, "/login", url.Values{"csrf": {br.csrf("/login")}, "operator": {"alice"}, "token": {token}, "next": {"/faults"}})
	if code != http.StatusSeeOther || hd.Get("Location") != "/faults" {
		t.Fatalf("login: %d to %q, want 303 to /faults", code, hd.Get("Location"))
	}
	var session *http.Cookie
	for _, c := range (&http.Response{Header: hd}).Cookies() {
		if c.Name == "console_session" {
			session = c
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Secure {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure on plain HTTP without SecureCookies", session)
	}
	if strings.Contains(session.Value, token) || len(session.Value) < 43 {
		t.Fatalf("session cookie %q: want an opaque random id, not the token", session.Value)
	}
	for _, p := range []string{"/", "/orders", "/faults", "/repair", "/api/overview", "/login"} {
		br.do(http.MethodGet, p, nil)
	}
	assertNoToken(t, br)
	for _, s := range br.seen {
		if strings.Contains(s, wrong) {
			t.Fatalf("a response or URL carries the wrong token: %.200q", s)
		}
	}
}

func assertNoToken(t *testing.T, br *browser) {
	t.Helper()
	for _, s := range br.seen {
		if strings.Contains(s, token) {
			t.Fatalf("a response body, Location or URL carries the operator token: %.200q", s)
		}
	}
}

func TestReadPages_NeedLoginUnlessReadOpen(t *testing.T) {
	_, closed := console(t, web.Config{OperatorToken: token})
	br := newBrowser(t, closed.URL)
	for _, p := range []string{"/", "/orders", "/faults", "/repair", "/orders/8a3c4c8e-1f0b-4a8e-9d7e-2b8b7f0a1c11"} {
		if code, _, hd := br.do(http.MethodGet, p, nil); code != http.StatusSeeOther || !strings.HasPrefix(hd.Get("Location"), "/login") {
			t.Errorf("closed console GET %s: %d to %q, want 303 to /login", p, code, hd.Get("Location"))
		}
	}
	if code, _, _ := br.do(http.MethodGet, "/api/overview", nil); code != http.StatusUnauthorized {
		t.Errorf("closed console /api/overview: %d, want 401", code)
	}
	br.login(token)
	if code, _, _ := br.do(http.MethodGet, "/faults", nil); code != http.StatusOK {
		t.Errorf("logged in GET /faults: %d, want 200", code)
	}

	_, open := console(t, web.Config{OperatorToken: token, ReadOpen: true})
	anon := newBrowser(t, open.URL)
	for _, p := range []string{"/", "/faults", "/repair", "/api/overview"} {
		if code, _, _ := anon.do(http.MethodGet, p, nil); code != http.StatusOK {
			t.Errorf("open console GET %s: %d, want 200", p, code)
		}
	}
}

func TestCookiesAreSecureAndHostPrefixedWhenConfigured(t *testing.T) {
	_, ts := console(t, web.Config{OperatorToken: token, SecureCookies: true})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, ts.URL+"/login", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cs := resp.Cookies()
	if len(cs) == 0 {
		t.Fatal("no CSRF cookie issued")
	}
	for _, c := range cs {
		if !strings.HasPrefix(c.Name, "__Host-") || !c.Secure || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Domain != "" {
			t.Errorf("cookie %s: %+v, want __Host- named, Secure, HttpOnly, SameSite=Strict, Path=/, no Domain", c.Name, c)
		}
	}
}

func TestLoginDisabledWithoutConfiguredToken(t *testing.T) {
	_, ts := console(t, web.Config{ReadOpen: true})
	br := newBrowser(t, ts.URL)
	if code := br.login(""); code != http.StatusUnauthorized {
		t.Fatalf("empty token against an unarmed console: %d, want 401", code)
	}
}

// flip changes the first character of s.
func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}
