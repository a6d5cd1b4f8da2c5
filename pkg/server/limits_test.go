package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
)

// grace is how much later than its configured bound a timeout may fire on a
// loaded machine; the tests' own deadlines are bound + grace.
const grace = 3 * time.Second

// gatewayStatus is the JSON google.rpc.Status the gateway writes for errors.
type gatewayStatus struct {
	Code    int               `json:"code"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

// httpResult is a response read whole.
type httpResult struct {
	StatusCode int
	Header     http.Header
}

func doHTTP(t *testing.T, req *http.Request) (httpResult, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResult{resp.StatusCode, resp.Header}, body
}

func decodeStatus(t *testing.T, body []byte) gatewayStatus {
	t.Helper()
	var st gatewayStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("body is not a JSON google.rpc.Status: %v: %.200s", err, body)
	}
	return st
}

// Request headers beyond what the gateway could forward under the gRPC
// header-list limit are refused with 431 before any handler runs; headers
// of half the limit pass.
func TestOversizeHeadersAre431(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		bytes int
		want  int
	}{
		{server.DefaultMaxHeaderListBytes + 1024, http.StatusRequestHeaderFieldsTooLarge},
		{server.DefaultMaxHeaderListBytes / 2, http.StatusOK},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders",
			strings.NewReader(`{"customer_id": "c1", "quantity": 1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Pad", strings.Repeat("p", tc.bytes))
		if resp, body := doHTTP(t, req); resp.StatusCode != tc.want {
			t.Fatalf("%d bytes of headers: HTTP %d, want %d: %.300s", tc.bytes, resp.StatusCode, tc.want, body)
		}
	}
	if n := b.fake.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once (the request under the limit)", n)
	}
}

// A body over the limit is refused with 413 and the gateway's JSON error,
// whether its size is declared (Content-Length) or only discovered while
// reading (chunked); the handler never runs.
func TestOversizeBodyIs413WithTheGatewayErrorShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := `{"customer_id": "c1", "quantity": 1, "note": "` + strings.Repeat("a", 2<<20) + `"}`
	for _, tc := range []struct {
		name string
		body io.Reader
	}{
		{"declared length", strings.NewReader(big)},
		// An io.Reader of unknown length is sent chunked.
		{"chunked", io.MultiReader(strings.NewReader(big))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", tc.body)
			req.Header.Set("Content-Type", "application/json")
			resp, body := doHTTP(t, req)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("HTTP %d, want 413: %.300s", resp.StatusCode, body)
			}
			st := decodeStatus(t, body)
			if st.Code != int(codes.InvalidArgument) || !strings.Contains(st.Message, "1048576") {
				t.Fatalf("status %+v, want INVALID_ARGUMENT naming the 1048576-byte limit", st)
			}
		})
	}
	if n := b.fake.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for oversize bodies", n)
	}
}

// readUntilClosed reads conn until the server closes it, failing the test if
// that does not happen by deadline. It returns what the server sent.
func readUntilClosed(t *testing.T, conn net.Conn, deadline time.Time, what string) []byte {
	t.Helper()
	if err := conn.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatalf("%s: connection still open at the test's deadline; server sent %q", what, got)
	}
	return got // EOF or reset: the server closed it
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Slow loris: a client that never finishes its headers is disconnected after
// ReadHeaderTimeout, without a response.
func TestUnfinishedHeadersAreCutOffAfterReadHeaderTimeout(t *testing.T) {
	t.Parallel()
	cfg := server.Config{ReadHeaderTimeout: 200 * time.Millisecond}
	b := setupWith(t, cfg)
	conn := dial(t, b.srv.HTTPAddr())
	start := time.Now()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	readUntilClosed(t, conn, start.Add(cfg.ReadHeaderTimeout+grace), "unfinished headers")
}

// A body trickled slower than ReadTimeout allows is cut off: the client gets
// 408 with the gateway's JSON error (no server address in it) and the
// connection is closed.
func TestTrickledBodyIsCutOffAfterReadTimeoutWith408(t *testing.T) {
	t.Parallel()
	cfg := server.Config{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond}
	b := setupWith(t, cfg)
	conn := dial(t, b.srv.HTTPAddr())
	start := time.Now()
	if _, err := io.WriteString(conn, "PUT /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 1000\r\n\r\n{\"quantity\": "); err != nil {
		t.Fatal(err)
	}
	got := readUntilClosed(t, conn, start.Add(cfg.ReadTimeout+grace), "trickled body")
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("no HTTP response before close: %v: %q", err, got)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("HTTP %d, want 408: %s", resp.StatusCode, body)
	}
	if st := decodeStatus(t, body); strings.Contains(st.Message, "127.0.0.1") || strings.Contains(st.Message, "i/o timeout") {
		t.Fatalf("408 body leaks the transport error: %s", body)
	}
	if n := b.fake.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for a truncated body", n)
	}
}

// A keep-alive connection left idle is closed after IdleTimeout.
func TestIdleKeepAliveConnectionIsClosedAfterIdleTimeout(t *testing.T) {
	t.Parallel()
	cfg := server.Config{IdleTimeout: 300 * time.Millisecond}
	b := setupWith(t, cfg)
	conn := dial(t, b.srv.HTTPAddr())
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(grace)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	idleFrom := time.Now()
	if err := conn.SetReadDeadline(idleFrom.Add(cfg.IdleTimeout + grace)); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			t.Fatal("idle connection still open at the test's deadline")
		}
		return // closed
	}
	t.Fatal("server sent bytes on an idle connection")
}

// deadlineProbe records the deadline a handler's context carries.
func deadlineProbe(got chan<- time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		d, ok := ctx.Deadline()
		if !ok {
			got <- -1
		} else {
			got <- time.Until(d)
		}
		return handler(ctx, req)
	}
}

// Handlers always run under a deadline no later than RequestTimeout: one is
// set when the client sent none or a longer one; a shorter client deadline
// is kept. REST requests get the same.
func TestHandlersRunUnderTheRequestDeadline(t *testing.T) {
	t.Parallel()
	got := make(chan time.Duration, 1)
	cfg := server.Config{RequestTimeout: 2 * time.Second}
	b := setupWith(t, cfg, server.WithUnaryInterceptors(deadlineProbe(got)))
	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := testpb.NewOrderServiceClient(conn)

	check := func(name string, ctx context.Context, lo, hi time.Duration) {
		t.Helper()
		if _, err := client.PutOrder(ctx, validOrder()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d := <-got; d < lo || d > hi {
			t.Errorf("%s: handler deadline in %v, want within [%v, %v]", name, d, lo, hi)
		}
	}
	check("no client deadline", context.Background(), 0, cfg.RequestTimeout)
	long, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	check("longer client deadline", long, 0, cfg.RequestTimeout)
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	check("shorter client deadline", short, 0, 500*time.Millisecond)

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	if resp, body := doHTTP(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("REST: HTTP %d %s", resp.StatusCode, body)
	}
	if d := <-got; d < 0 || d > cfg.RequestTimeout {
		t.Errorf("REST: handler deadline in %v, want within (0, %v]", d, cfg.RequestTimeout)
	}
}

// failWith makes every call that passes validation fail with err, as a
// handler would.
func failWith(err error) server.Option {
	return server.WithUnaryInterceptors(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, err
	})
}

// secrets are texts of the injected errors no client may see.
var secrets = []string{"SELECT", "secret_table", "10.1.2.3", "user=app", "terminating connection", "SQLSTATE"}

func assertNoSecrets(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s leaks %q: %s", where, s, text)
		}
	}
}

// An outage error from a handler (here PostgreSQL's admin shutdown, as pgx
// reports it) reaches clients as UNAVAILABLE with a retry hint and nothing
// of the database's text: gRPC gets RetryInfo, REST 503 with Retry-After.
func TestDatabaseOutageIsUnavailableWithRetryAfterAndNoDetails(t *testing.T) {
	t.Parallel()
	outage := fmt.Errorf("SELECT * FROM secret_table (host=10.1.2.3 user=app): %w",
		&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
	b := setupWith(t, server.Config{}, failWith(outage))

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	resp, body := doHTTP(t, req)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("REST: HTTP %d, Retry-After %q, want 503 with Retry-After: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if st := decodeStatus(t, body); st.Code != int(codes.Unavailable) {
		t.Fatalf("REST: body code %d, want UNAVAILABLE (14): %s", st.Code, body)
	}
	assertNoSecrets(t, "REST body", string(body))

	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = testpb.NewOrderServiceClient(conn).PutOrder(context.Background(), validOrder())
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if st.Code() != codes.Unavailable || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("gRPC: %v (retry info %v), want UNAVAILABLE with a retry delay", err, retry)
	}
	assertNoSecrets(t, "gRPC message", st.Message())
	if !strings.Contains(b.logs.String(), "terminating connection") {
		t.Errorf("the real error is not in the log: %s", b.logs.String())
	}
}

// Any other unexpected error is a bare INTERNAL (500) naming the trace or
// request id, never its text; the text goes to the log.
func TestUnexpectedErrorIsInternalWithoutItsText(t *testing.T) {
	t.Parallel()
	bug := &pgconn.PgError{Severity: "ERROR", Code: "42P01", Message: `relation "secret_table" does not exist`,
		InternalQuery: "SELECT * FROM secret_table WHERE host = '10.1.2.3' AND user=app"}
	b := setupWith(t, server.Config{}, failWith(fmt.Errorf("list: %w", bug)))
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	resp, body := doHTTP(t, req)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("HTTP %d, want 500: %s", resp.StatusCode, body)
	}
	st := decodeStatus(t, body)
	if st.Code != int(codes.Internal) || !strings.HasPrefix(st.Message, "internal error") {
		t.Fatalf("status %+v, want INTERNAL \"internal error ...\"", st)
	}
	assertNoSecrets(t, "REST body", string(body))
	if !strings.Contains(b.logs.String(), "secret_table") {
		t.Errorf("the real error is not in the log: %s", b.logs.String())
	}
}

// Errors handlers already made statuses pass unchanged; a client's own
// cancellation is CANCELLED, not an outage.
func TestStatusErrorsPassAndCancellationIsCancelled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"status", status.Error(codes.NotFound, "order \"x\" not found"), codes.NotFound},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setupWith(t, server.Config{}, failWith(tc.err))
			conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = testpb.NewOrderServiceClient(conn).PutOrder(context.Background(), validOrder())
			if st := status.Convert(err); st.Code() != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if tc.want == codes.NotFound && status.Convert(err).Message() != "order \"x\" not found" {
				t.Fatalf("status message changed: %v", err)
			}
		})
	}
}

// /readyz answers a fixed body: the failing check's error (addresses,
// users) goes to the log only, and only once while it keeps failing.
func TestReadyzHidesTheCauseAndLogsItOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.AddReadinessCheck("database", func(context.Context) error {
		return errors.New("failed to connect to `user=app database=workorder`: 10.1.2.3:5432: dial error: connection refused")
	})
	for range 3 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, b.base+"/readyz", nil)
		resp, body := doHTTP(t, req)
		if resp.StatusCode != http.StatusServiceUnavailable || string(body) != "not ready\n" {
			t.Fatalf("HTTP %d %q, want 503 \"not ready\\n\"", resp.StatusCode, body)
		}
	}
	if n := strings.Count(b.logs.String(), "10.1.2.3"); n != 1 {
		t.Fatalf("cause logged %d times over 3 polls, want once: %s", n, b.logs.String())
	}
}
