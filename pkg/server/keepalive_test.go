package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// N4: the path to a server goes dead under an open gRPC connection (a
// half-open connection: the server's gRPC stack never sees the bytes, no
// RST comes). A call on it ends at its own deadline; the client's
// keepalive pings go unanswered and close the connection within
// ClientKeepaliveTime + ClientKeepaliveTimeout, and once the path heals the
// channel serves again on a new connection. The server permits the pings
// (no GOAWAY too_many_pings). Without the keepalive the channel stays READY
// on the dead connection until TCP gives up.
func TestStalledConnection_CallEndsAtItsDeadline_KeepaliveClosesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewStallProxy(t, b.srv.GRPCAddr())
	conn, err := grpc.NewClient(proxy.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()), server.ClientKeepalive())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewOrderServiceClient(conn)
	put := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := client.PutOrder(ctx, validOrder())
		return err
	}
	if err := put(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	const deadline = time.Second
	start := time.Now()
	err = put(deadline)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call on a dead connection: %v, want DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > deadline+3*time.Second {
		t.Errorf("call on a dead connection ended after %v, want at its %v deadline", elapsed, deadline)
	}

	bound := server.ClientKeepaliveTime + server.ClientKeepaliveTimeout
	waitfor.Condition(t, bound+10*time.Second, "keepalive closed the dead connection", func() bool {
		return conn.GetState() != connectivity.Ready
	})
	t.Logf("dead connection closed %v after the stall (bound %v from its last byte)", time.Since(start), bound)

	proxy.Heal()
	waitfor.Condition(t, 20*time.Second, "a call succeeds after heal", func() bool { return put(2*time.Second) == nil })
	if n := proxy.Accepted(); n < 2 {
		t.Errorf("%d connections through the proxy, want a new one after the dead one was closed", n)
	}
}

// N2: a handler that runs out of time (a statement on a dead database)
// answers while the REST gateway still waits for it: the gateway's deadline
// is REQUEST_TIMEOUT plus a reply margin, so a REST request gets the
// handler's 503 (at REQUEST_TIMEOUT) rather than the gateway's own 504.
func TestHandlerOutOfTimeAnswers503OverREST(t *testing.T) {
	t.Parallel()
	waitsForDeadline := server.WithUnaryInterceptors(func(ctx context.Context, _ any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
		<-ctx.Done()
		return nil, status.Error(codes.Unavailable, "database unavailable; retry")
	})
	const requestTimeout = time.Second
	b := setupWith(t, server.Config{RequestTimeout: requestTimeout}, waitsForDeadline)
	for i := range 3 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
		start := time.Now()
		resp, body := doHTTP(t, req)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("REST %d: HTTP %d %s, want the handler's 503", i, resp.StatusCode, body)
		}
		if elapsed := time.Since(start); elapsed > requestTimeout+3*time.Second {
			t.Errorf("REST %d: answered after %v, want at REQUEST_TIMEOUT %v", i, elapsed, requestTimeout)
		}
	}
}
