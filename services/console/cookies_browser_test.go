package main_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/console/internal/overview"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

type noFigures struct{}

func (noFigures) Read(context.Context) (overview.Figures, error) { return overview.Figures{}, nil }

// Secure, __Host- named cookies over plain HTTP: Chromium keeps them for
// http://localhost and http://127.0.0.1, so `kubectl port-forward` and
// compose's published port log in although the console's cookies are
// Secure (ADR 0019); and the plain cookies of a loopback console (`make
// run`) log in too.
func TestCookiesLogInInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("browser")
	}
	chromium(t)
	const token = "0123456789abcdef0123456789abcdef-cookie-test"
	// No service answers: the login does not call one, and the pages show
	// their errors.
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, tc := range []struct {
		name   string
		secure bool
		host   string
	}{
		{"Secure __Host- cookies on localhost", true, "localhost"},
		{"plain cookies on 127.0.0.1", false, "127.0.0.1"},
		{"Secure __Host- cookies on 127.0.0.1", true, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := web.New(web.Sources{
				Orders: workorderv1.NewWorkOrderServiceClient(conn), Inbox: opsv1.NewOperatorServiceClient(conn),
				BillingRepairs: opsv1.NewOperatorServiceClient(conn),
				WorkOrderOps:   opsv1.NewOperatorServiceClient(conn), BillingOps: opsv1.NewOperatorServiceClient(conn),
				ProviderAudit: opsv1.NewOperatorServiceClient(conn),
				Faults:        providerv1.NewProviderAdminServiceClient(conn), Invoices: billingv1.NewBillingServiceClient(conn),
				Figures: noFigures{}, Outbox: opsv1.NewOperatorServiceClient(conn),
				ProviderJobs: providerv1.NewProviderAdminServiceClient(conn), InvoiceJobs: opsv1.NewOperatorServiceClient(conn),
			}, web.Config{OperatorToken: token, SecureCookies: tc.secure, RunbookBaseURL: "https://example.invalid/",
				RPCTimeout: time.Second}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			_, port, _ := net.SplitHostPort(ln.Addr().String())
			site := "http://" + tc.host + ":" + port

			ctx, cancel := context.WithTimeout(browser(t, t.Context()), time.Minute)
			defer cancel()
			err = chromedp.Do(ctx,
				chromedp.Navigate(site+"/login?next=/faults"),
				chromedp.WaitVisible(chromedp.ID("token")),
				chromedp.SendKeys(chromedp.ID("operator"), "alice"),
				chromedp.SendKeys(chromedp.ID("token"), token),
				chromedp.Submit(chromedp.ID("token")),
				chromedp.WaitVisible(chromedp.CSS("[data-principal]")),
			)
			if err != nil {
				t.Fatalf("log in at %s: %v", site, err)
			}
			who, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("[data-principal]")))
			if err != nil {
				t.Fatal(err)
			}
			cookies, err := networkCookies(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if who != "alice (shared token)" {
				t.Fatalf("logged in as %q, want alice (shared token)", who)
			}
			wantPrefix := ""
			if tc.secure {
				wantPrefix = "__Host-"
			}
			for _, c := range cookies {
				if !strings.HasPrefix(c, wantPrefix+"console_") {
					t.Errorf("cookie %s: want the name prefix %q", c, wantPrefix)
				}
			}
			if len(cookies) != 2 {
				t.Errorf("cookies %v: want the session's and the CSRF cookie", cookies)
			}
		})
	}
}

// networkCookies names the cookies the browser holds for the page.
func networkCookies(ctx context.Context) ([]string, error) {
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, c := range res.Cookies {
		names = append(names, c.Name)
	}
	return names, nil
}
