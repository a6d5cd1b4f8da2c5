package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
)

// N2: the database stops answering under the service's open connections
// (half-open: a partition, no RST). A create over REST answers 503 within
// REQUEST_TIMEOUT, not when TCP gives up, and not the gateway's own 504:
// the handler's deadline ends a reply margin before the request's. Creates
// succeed again once the path heals.
func TestStalledDatabase_CreateAnswers503WithinTheRequestTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, proxy := pgtest.StallDSN(t, pgtest.NewDatabase(t, migrations.WorkOrder()...))
	provider := &blockingProvider{called: make(chan string, 64), release: make(chan struct{})}
	close(provider.release)
	cfg := testConfig(t, dsn, startProvider(t, provider))
	const requestTimeout = 3 * time.Second
	cfg.Server.RequestTimeout = requestTimeout
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		proxy.Heal()
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	base := "http://" + a.HTTPAddr()
	create := func() (int, string) {
		// The client waits far longer than the server's deadline: the
		// bound under test is the server's.
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/work-orders",
			strings.NewReader(`{"customer_id":"acme","description":"paint","positions":2,"unit_price":{"currency_code":"EUR","minor_units":100}}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitfor.Condition(t, 10*time.Second, "readyz 200", func() bool { code, _ := get(t, base+"/readyz"); return code == http.StatusOK })
	if code, body := create(); code != http.StatusOK {
		t.Fatalf("create before the stall: HTTP %d: %s", code, body)
	}

	proxy.Stall()
	for i := range 3 { // the first meets a pooled connection, later ones may dial
		start := time.Now()
		code, body := create()
		elapsed := time.Since(start)
		t.Logf("create %d on a dead database: HTTP %d after %v", i, code, elapsed)
		if code != http.StatusServiceUnavailable {
			t.Errorf("create %d on a dead database: HTTP %d: %s, want 503", i, code, body)
		}
		if elapsed > requestTimeout+3*time.Second {
			t.Errorf("create %d on a dead database answered after %v, want within REQUEST_TIMEOUT %v", i, elapsed, requestTimeout)
		}
	}

	proxy.Heal()
	waitfor.Condition(t, 20*time.Second, "creates succeed after heal", func() bool { code, _ := create(); return code == http.StatusOK })
}
