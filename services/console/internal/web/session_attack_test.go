package web_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/services/console/internal/web"
)

// An attacker's anonymous CSRF pair (the cookie and its signature, from GET
// /login) must not pass with the victim's session: the CSRF value is bound
// to the session it was issued to.
func TestCSRF_AnonymousPairWithAVictimsSession_Refused(t *testing.T) {
	b, ts := console(t, web.Config{OperatorToken: token})
	attacker := newBrowser(t, ts.URL)
	attackerCSRF := attacker.csrf("/login")
	victim := newBrowser(t, ts.URL)
	if code := victim.login(token); code != http.StatusSeeOther {
		t.Fatalf("victim login: %d, want 303", code)
	}
	u, _ := url.Parse(ts.URL)
	var cookies []*http.Cookie
	for _, c := range attacker.client.Jar.Cookies(u) {
		if strings.Contains(c.Name, "csrf") {
			cookies = append(cookies, c)
		}
	}
	for _, c := range victim.client.Jar.Cookies(u) {
		if strings.Contains(c.Name, "session") {
			cookies = append(cookies, c)
		}
	}
	if len(cookies) != 2 {
		t.Fatalf("cookies %v: want the attacker's CSRF cookie and the victim's session cookie", cookies)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/faults", strings.NewReader(faultsForm(attackerCSRF).Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /faults with an anonymous CSRF pair and the victim's session: %d, want 403", resp.StatusCode)
	}
	if dup, _ := b.state(); dup != 0 {
		t.Fatalf("the forged request changed the knobs: duplicate %v", dup)
	}
}

// The post-login target is a path on this site, whatever the browser would
// make of the raw value: tabs and newlines are stripped by browsers, so
// "/\t/evil.example" is "//evil.example", another host.
func TestLogin_NextIsALocalPath(t *testing.T) {
	_, ts := console(t, web.Config{OperatorToken: token})
	for _, next := range []string{"/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "//evil.example",
		"/\\evil.example", "\\/evil.example", "/%2F/evil.example", "https://evil.example/", "/%09/evil.example",
		" //evil.example", "/\x00/evil.example", "/\u3000/evil.example"} {
		br := newBrowser(t, ts.URL)
		code, page, _ := br.do(http.MethodGet, "/login?next="+url.QueryEscape(next), nil)
		m := nextRE.FindStringSubmatch(page)
		if code != http.StatusOK || m == nil {
			t.Fatalf("GET /login?next=%q: %d, no next field", next, code)
		}
		form := url.Values{"csrf": {csrfRE.FindStringSubmatch(page)[1]}, "token": {token}, "next": {unescapeHTML(m[1])},
			"operator": {"alice"}}
		code, loc := postRaw(t, br, "/login", form)
		if code != http.StatusSeeOther || !localPath(loc) {
			t.Errorf("next %q: login answered %d to %q, want 303 to a path on this site", next, code, loc)
		}
		// Posted directly, not through the page.
		form.Set("next", next)
		br = newBrowser(t, ts.URL)
		form.Set("csrf", br.csrf("/login"))
		if code, loc := postRaw(t, br, "/login", form); code != http.StatusSeeOther || !localPath(loc) {
			t.Errorf("posted next %q: login answered %d to %q, want 303 to a path on this site", next, code, loc)
		}
	}
	// A local target survives, query included.
	br := newBrowser(t, ts.URL)
	form := url.Values{"csrf": {br.csrf("/login")}, "token": {token}, "operator": {"alice"}, "next": {"/repair?reason=POISON"}}
	if _, _, hd := br.do(http.MethodPost, "/login", form); hd.Get("Location") != "/repair?reason=POISON" {
		t.Errorf("next /repair?reason=POISON: redirected to %q", hd.Get("Location"))
	}
}

// localPath reports whether a browser following loc stays on this site: it
// strips ASCII tab and newline, treats a backslash as a slash, and leading
// "//" names a host.
func localPath(loc string) bool {
	clean := strings.NewReplacer("\t", "", "\n", "", "\r", "", "\\", "/").Replace(loc)
	u, err := url.Parse(clean)
	return err == nil && strings.HasPrefix(clean, "/") && !strings.HasPrefix(clean, "//") && u.Host == "" && u.Scheme == "" &&
		!strings.ContainsFunc(loc, func(r rune) bool { return r < 0x20 || r == 0x7f || r > 0x7e })
}

var nextRE = regexp.MustCompile(`name="next" value="([^"]*)"`)

func unescapeHTML(s string) string { return html.UnescapeString(s) }

// postRaw posts form with br's cookies and returns the status and the raw
// Location: the client would refuse to follow (or even parse) a Location
// with control characters, a browser does not.
func postRaw(t *testing.T, br *browser, path string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, br.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range br.client.Jar.Cookies(req.URL) {
		req.AddCookie(c)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}
