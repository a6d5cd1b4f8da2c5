package web_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/services/console/internal/login"
	"github.com/lossless-dev/lossless/services/console/internal/session"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// syncBuffer is a log sink the handlers may write to concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func loginAs(br *browser, name, cred string) (int, http.Header) {
	br.t.Helper()
	code, _, hd := br.do(http.MethodPost, "/login", url.Values{"csrf": {br.csrf("/login")}, "operator": {name}, "token": {cred}, "next": {"/faults"}})
	return code, hd
}

// After CONSOLE_LOGIN_FAILURES failures from one address the login form
// answers 429 with Retry-After, the right credential included, and the log
// names the address.
func TestLogin_FailuresLimitedPerAddress(t *testing.T) {
	logs := &syncBuffer{}
	_, ts := consoleLogging(t, web.Config{OperatorToken: token, LoginLimit: login.LimitConfig{Failures: 3, Window: time.Hour}},
		slog.New(slog.NewJSONHandler(logs, nil)))
	br := newBrowser(t, ts.URL)
	for i := range 3 {
		if code, _ := loginAs(br, "mallory", token+"-guess"); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, code)
		}
	}
	code, hd := loginAs(br, "alice", token)
	if code != http.StatusTooManyRequests || hd.Get("Retry-After") == "" {
		t.Fatalf("4th attempt: %d, Retry-After %q; want 429 with Retry-After", code, hd.Get("Retry-After"))
	}
	if code, _, _ := br.do(http.MethodGet, "/faults", nil); code != http.StatusSeeOther {
		t.Fatalf("GET /faults after a refused login: %d, want 303 to /login (not logged in)", code)
	}
	if !strings.Contains(logs.String(), `"msg":"console: login refused","peer":"127.0.0.1"`) ||
		!strings.Contains(logs.String(), "too many failures") {
		t.Fatalf("log does not name the peer of refused logins: %s", logs.String())
	}
	if strings.Contains(logs.String(), token) {
		t.Fatal("the log carries the token")
	}
}

// Behind a load balancer (CONSOLE_TRUSTED_PROXIES) the limit counts the
// forwarded client address and the operator name: failures for one name
// from one client lock out that name and that client, not the others.
func TestLogin_BehindALoadBalancerLimitsPerNameAndPerClient(t *testing.T) {
	lb, err := login.ParseTrustedProxies("127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	_, ts := console(t, web.Config{OperatorToken: token, TrustedProxies: lb,
		LoginLimit: login.LimitConfig{Failures: 3, Window: time.Hour}})
	from := func(client string) *browser {
		br := newBrowser(t, ts.URL)
		br.header = http.Header{"X-Forwarded-For": {"198.51.100.9, " + client}} // the left hop is the client's to invent
		return br
	}
	attacker := from("203.0.113.1")
	for i := range 3 {
		if code, _ := loginAs(attacker, "mallory", token+"-guess"); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, code)
		}
	}
	if code, _ := loginAs(from("203.0.113.2"), "alice", token); code != http.StatusSeeOther {
		t.Fatalf("alice from another client after mallory's failures: %d, want 303 (logged in)", code)
	}
	if code, _ := loginAs(from("203.0.113.3"), "mallory", token); code != http.StatusTooManyRequests {
		t.Fatalf("the failed name from another client: %d, want 429", code)
	}
	if code, _ := loginAs(attacker, "bob", token); code != http.StatusTooManyRequests {
		t.Fatalf("another name from the failed client: %d, want 429", code)
	}
	// IPv6 clients are counted by their /64.
	v6 := func(n int) *browser { return from(fmt.Sprintf("2001:db8:1:2::%d", n)) }
	for i := range 3 {
		if code, _ := loginAs(v6(i+1), fmt.Sprintf("guess%d", i), token+"-guess"); code != http.StatusUnauthorized {
			t.Fatalf("IPv6 failure %d: %d, want 401", i+1, code)
		}
	}
	if code, _ := loginAs(v6(99), "carol", token); code != http.StatusTooManyRequests {
		t.Fatalf("another address of the failed /64: %d, want 429", code)
	}
}

// A session ends after its idle timeout and at its lifetime.
func TestSession_ExpiresWhenIdle(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}
	_, ts := console(t, web.Config{OperatorToken: token, Sessions: session.Config{TTL: time.Hour, Idle: 10 * time.Minute, Now: c.now}})
	br := newBrowser(t, ts.URL)
	if code := br.login(token); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	c.add(9 * time.Minute)
	if code, _, _ := br.do(http.MethodGet, "/faults", nil); code != http.StatusOK {
		t.Fatalf("within the idle timeout: %d, want 200", code)
	}
	c.add(10 * time.Minute)
	if code, _, hd := br.do(http.MethodGet, "/faults", nil); code != http.StatusSeeOther || !strings.HasPrefix(hd.Get("Location"), "/login") {
		t.Fatalf("after the idle timeout: %d, want 303 to /login", code)
	}
}

func operatorLine(name, cred string) string {
	d := sha256.Sum256([]byte(cred))
	return name + " " + hex.EncodeToString(d[:]) + "\n"
}

// With an operators file each operator logs in with their own credential;
// the shared token is no login; the audit actor is the operator's name;
// changing the credential in the file ends the sessions made with the old one.
func TestOperatorsFile_OwnCredentialsAndRevocation(t *testing.T) {
	const bobCred = "bob-credential-0123456789abcdef0123456789"
	path := filepath.Join(t.TempDir(), "operators")
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	write(operatorLine("bob", bobCred), t0)
	ops, err := login.OpenFile(path, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	bill, reg := billingBackend(t)
	_, ts := console(t, web.Config{OperatorToken: token, Operators: ops}, reg)

	br := newBrowser(t, ts.URL)
	if code, _ := loginAs(br, "bob", token); code != http.StatusUnauthorized {
		t.Fatalf("the shared token as bob's credential: %d, want 401", code)
	}
	if code, _ := loginAs(br, "alice", bobCred); code != http.StatusUnauthorized {
		t.Fatalf("bob's credential as alice: %d, want 401", code)
	}
	if code, _ := loginAs(br, "bob", bobCred); code != http.StatusSeeOther {
		t.Fatalf("bob: %d, want 303", code)
	}
	// The services get the service token: bob's dry run passes their guard,
	// audited with bob as the actor, whatever the form says.
	form := url.Values{"csrf": {br.csrf("/repair")}, "ticket": {"INC-9"}, "actor": {"someone-else"}, "mode": {"dry"}, "id": {"7"}}
	if code, body, _ := br.do(http.MethodPost, "/repair/jobs", form); code != http.StatusOK {
		t.Fatalf("dry run as bob: %d %s", code, body)
	}
	if a := bill.actors(); len(a) != 1 || a[0] != "bob" {
		t.Fatalf("audit actors %v, want [bob]", a)
	}

	// bob's credential changes: his session ends.
	write(operatorLine("bob", bobCred+"-rotated"), t0.Add(time.Minute))
	if code, _, hd := br.do(http.MethodGet, "/repair", nil); code != http.StatusSeeOther || !strings.HasPrefix(hd.Get("Location"), "/login") {
		t.Fatalf("after bob's credential changed: %d to %q, want 303 to /login", code, hd.Get("Location"))
	}
	if code, _ := loginAs(br, "bob", bobCred+"-rotated"); code != http.StatusSeeOther {
		t.Fatalf("bob with the new credential: %d", code)
	}
}

// identity stands in for an identity-aware proxy's verified header.
type identity struct{}

func (identity) Verify(r *http.Request) (string, error) {
	if v := r.Header.Get("X-Test-Identity"); v != "" {
		return v, nil
	}
	return "", errors.New("no identity assertion")
}

// Behind an identity-aware proxy the principal is the proxy's verified
// identity, not the typed name, and a request without it is not logged in.
func TestIdentityProxy_PrincipalIsTheVerifiedIdentity(t *testing.T) {
	bill, reg := billingBackend(t)
	_, ts := console(t, web.Config{OperatorToken: token, Identity: identity{}}, reg)
	br := newBrowser(t, ts.URL)
	br.header = http.Header{"X-Test-Identity": {"carol@example.com"}}
	if code, _ := loginAs(br, "mallory", token); code != http.StatusSeeOther {
		t.Fatalf("login behind the proxy: %d, want 303", code)
	}
	form := url.Values{"csrf": {br.csrf("/repair")}, "ticket": {"INC-10"}, "mode": {"dry"}, "id": {"7"}}
	if code, body, _ := br.do(http.MethodPost, "/repair/jobs", form); code != http.StatusOK {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if a := bill.actors(); len(a) != 1 || a[0] != "carol@example.com" {
		t.Fatalf("audit actors %v, want [carol@example.com]", a)
	}
	// Another identity (or none) with carol's session cookie: not logged in.
	br.header = http.Header{"X-Test-Identity": {"mallory@example.com"}}
	if code, _, _ := br.do(http.MethodGet, "/repair", nil); code != http.StatusSeeOther {
		t.Fatalf("carol's session under another identity: %d, want 303 to /login", code)
	}
	br.header = nil
	if code, _ := loginAs(br, "carol@example.com", token); code != http.StatusUnauthorized {
		t.Fatalf("login without the proxy's assertion: %d, want 401", code)
	}
}

// A change of the fault knobs needs a ticket and is sent with the
// session's principal as actor (a form's actor field is ignored):
// provider-sim records it, and the Audit page lists that row under
// provider-sim. The console's log line adds the operator's address.
func TestFaults_ChangeAuditedWithThePrincipal(t *testing.T) {
	logs := &syncBuffer{}
	b, ts := consoleLogging(t, web.Config{OperatorToken: token}, slog.New(slog.NewJSONHandler(logs, nil)))
	br := newBrowser(t, ts.URL)
	if code, _ := loginAs(br, "alice", token); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	form := faultsForm(br.csrf("/faults"))
	form.Set("actor", "someone-else")
	form.Del("ticket")
	if code, _, _ := br.do(http.MethodPost, "/faults", form); code != http.StatusBadRequest {
		t.Fatalf("without a ticket: %d, want 400", code)
	}
	if dup, _ := b.state(); dup != 0 {
		t.Fatalf("refused change applied: duplicate %v", dup)
	}
	form.Set("ticket", "CHG-7")
	if code, _, _ := br.do(http.MethodPost, "/faults", form); code != http.StatusSeeOther {
		t.Fatalf("with a ticket: %d, want 303", code)
	}
	b.mu.Lock()
	rows := b.audit
	b.mu.Unlock()
	if len(rows) != 1 {
		t.Fatalf("provider-sim's audit rows: %v, want the one change", rows)
	}
	row := rows[0]
	if row.GetAction() != "faults.update" || row.GetActor() != "alice (shared token)" || row.GetTicket() != "CHG-7" {
		t.Fatalf("audit row %v: want faults.update by alice (shared token) under CHG-7", row)
	}
	_, page, _ := br.do(http.MethodGet, "/audit?service=provider-sim", nil)
	if !strings.Contains(page, "operator_audit of provider-sim") || !strings.Contains(page, "<td data-audit-ticket>CHG-7</td><td>alice (shared token)</td>") ||
		!strings.Contains(page, `&#34;after&#34;:{&#34;duplicate&#34;:0.5}`) {
		t.Fatalf("Audit page of provider-sim lacks the change:\n%s", page)
	}
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"msg":"console: fault knobs changed"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line["actor"] != "alice (shared token)" || line["ticket"] != "CHG-7" || line["peer"] != "127.0.0.1" {
		t.Fatalf("log line %v: want the actor, ticket and peer of the change", line)
	}
}

func TestLoginLimit_CountsIPv6ByItsSlash64(t *testing.T) {
	for peer, want := range map[string]string{
		"192.0.2.7":                "192.0.2.7",
		"::ffff:192.0.2.7":         "192.0.2.7",
		"2001:db8:1:2:3:4:5:6":     "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":     "2001:db8:1:2::/64",
		"not an address (a proxy)": "not an address (a proxy)",
	} {
		if got := web.LimitKey(peer); got != want {
			t.Errorf("LimitKey(%q) = %q, want %q", peer, got, want)
		}
	}
}
