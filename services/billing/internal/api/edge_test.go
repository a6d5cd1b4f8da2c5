package api_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
)

// A page token that decodes to a time PostgreSQL cannot hold (here the
// smallest int64 of microseconds) is a bad token, not a server error.
func TestOutOfRangePageTokenIsInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, raw := range []string{
		"-9223372036854775808|0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11",
		"9223372036854775807|0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11",
	} {
		tok := base64.RawURLEncoding.EncodeToString([]byte(raw))
		_, err := b.grpc.ListInvoices(context.Background(), &billingv1.ListInvoicesRequest{PageToken: tok})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("token %q: %v, want INVALID_ARGUMENT", raw, err)
			continue
		}
		if f := violations(t, err); !slices.Equal(f, []string{"page_token"}) {
			t.Errorf("token %q: violations %v, want page_token", raw, f)
		}
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close()
	return port
}

// Billing's database is gone (connections refused): reads answer 503
// UNAVAILABLE with Retry-After (gRPC: RetryInfo), and nothing of the
// driver's error (host, user, database, SQL) reaches the client.
func TestDatabaseGoneIs503WithRetryAfterAndNoDetails(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf(
		"postgres://billing_app@127.0.0.1:%d/billing_db?sslmode=disable&connect_timeout=2", closedPort(t)))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setupOn(t, pool)

	leaks := []string{"127.0.0.1", "billing_app", "billing_db", "dial", "refused", "SELECT", "invoices"}
	for _, path := range []string{"/v1/invoices", "/v1/invoices/0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("GET %s: HTTP %d Retry-After %q, want 503 with Retry-After: %s", path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if !strings.Contains(string(body), `"code":14`) {
			t.Errorf("GET %s: body is not UNAVAILABLE: %s", path, body)
		}
		for _, leak := range leaks {
			if strings.Contains(string(body), leak) {
				t.Errorf("GET %s: body leaks %q: %s", path, leak, body)
			}
		}
	}

	_, err = b.grpc.ListInvoices(context.Background(), &billingv1.ListInvoicesRequest{})
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if st.Code() != codes.Unavailable || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("gRPC: %v (retry %v), want UNAVAILABLE with RetryInfo", err, retry)
	}
	for _, leak := range leaks {
		if strings.Contains(st.Message(), leak) {
			t.Errorf("gRPC message leaks %q: %s", leak, st.Message())
		}
	}
}
