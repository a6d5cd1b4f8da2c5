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
// answers while its caller still waits: the handler's deadline ends a reply
// margin before the caller's, so a gRPC client with a deadline, and a REST
// request (whose deadline is REQUEST_TIMEOUT), see the handler's
// UNAVAILABLE / 503 rather than their own DEADLINE_EXCEEDED / 504.
func TestHandlerOutOfTimeAnswersBeforeTheCallersDeadline(t *testing.T) {
	t.Parallel()
	waitsForDeadline := server.WithUnaryInterceptors(func(ctx context.Context, _ any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
		<-ctx.Done()
		return nil, status.Error(codes.Unavailable, "database unavailable; retry")
	})
	b := setupWith(t, server.Config{RequestTimeout: time.Second}, waitsForDeadline)
	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewOrderServiceClient(conn)
	for _, d := range []time.Duration{500 * time.Millisecond, time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := client.PutOrder(ctx, validOrder())
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("gRPC call with a %v deadline: %v, want the handler's Unavailable", d, err)
		}
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	if resp, body := doHTTP(t, req); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("REST: HTTP %d %s, want the handler's 503", resp.StatusCode, body)
	}
}
