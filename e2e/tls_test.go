package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/pkg/server"
)

// TestEndToEnd_TLSBetweenEveryProcess runs the whole system with TLS
// between every process (localstack.Config.TLS: the services' gRPC and
// HTTP listeners, the console, the REST gateway's loopback calls,
// workorder -> provider-sim, PostgreSQL with verify-full) and completes
// orders to INVOICED through it. It then checks that TLS is not optional:
// plaintext and certificate-less gRPC callers are refused, every service's
// database session is encrypted, and the console reads the services over
// mTLS.
func TestEndToEnd_TLSBetweenEveryProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs every service")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	binDir := buildServices(ctx, t)
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logw := &lockedWriter{w: &logs}
	// Its own PostgreSQL cluster: the stack starts it with ssl on.
	stack, err := localstack.Start(ctx, localstack.Config{BinDir: binDir, Ports: ports, Log: logw, TLS: true, Pprof: true,
		ExtraEnv: map[string][]string{"provider-sim": {"PROVIDER_EXEC_BASE=20ms", "PROVIDER_POLL_INTERVAL=50ms"}}})
	if err != nil {
		t.Fatalf("start stack: %v\n%s", err, logw.String())
	}
	t.Cleanup(func() {
		if err := stack.Stop(20 * time.Second); err != nil {
			t.Errorf("stop: %v", err)
		}
		if t.Failed() {
			t.Logf("process logs (tail):\n%s", tail(logw.String(), 20000))
		}
	})
	urls, addrs := stack.URLs(), stack.GRPCAddrs()
	for svc, u := range urls {
		if !strings.HasPrefix(u, "https://") {
			t.Fatalf("%s serves %s, want https://", svc, u)
		}
	}

	// The orders are created as the stack's demo client: an ID token from
	// the local issuer on a mutual-TLS connection.
	hc := stack.HTTPClient(15 * time.Second)
	caller, err := stack.CallerHTTPClient(hc)
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadgen.Run(ctx, loadgen.Config{BaseURL: urls["workorder"], Count: 30, Concurrency: 4, MaxPositions: 5,
		Wait: 3 * time.Minute, HTTP: caller})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 30 || res.Invoiced != 30 {
		t.Fatalf("over TLS: created %d, invoiced %d of 30; not invoiced: %v", res.Created, res.Invoiced, res.NotInvoiced)
	}

	// gRPC with the stack's client certificate is served ...
	token, err := stack.Caller("workorder").DialOption(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addrs["workorder"], stack.DialOption(), token)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := workorderv1.NewWorkOrderServiceClient(conn).GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: res.OrderIDs[0]})
	if err != nil || got.GetWorkOrder().GetStatus() != workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED {
		t.Fatalf("GetWorkOrder over mTLS: %v, %v", got, err)
	}
	// ... plaintext and certificate-less callers are not.
	caOnly, err := server.NewTLS(server.TLSConfig{CAFile: stack.CA.CAFile()})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"workorder", "provider-sim", "billing"} {
		for name, opt := range map[string]grpc.DialOption{
			"plaintext":             grpc.WithTransportCredentials(insecure.NewCredentials()),
			"no client certificate": caOnly.DialOption(),
		} {
			c, err := grpc.NewClient(addrs[svc], opt)
			if err != nil {
				t.Fatal(err)
			}
			_, err = workorderv1.NewWorkOrderServiceClient(c).GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: res.OrderIDs[0]})
			_ = c.Close()
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s, %s: %v, want UNAVAILABLE (handshake refused)", svc, name, err)
			}
		}
		plain := "http://" + strings.TrimPrefix(urls[svc], "https://") + "/readyz"
		if resp, err := http.Get(plain); err == nil { //nolint:noctx // test
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s: plaintext HTTP answered %d, want 400 (HTTP to an HTTPS port)", svc, resp.StatusCode)
			}
		}
	}

	// Profiles: on each replica's own loopback listener, not on the HTTP one.
	for _, in := range stack.Instances() {
		resp, err := http.Get(in.PprofURL + "/debug/pprof/heap") //nolint:noctx // test
		if err != nil {
			t.Fatalf("%s profiles: %v", in.ID, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: GET %s/debug/pprof/heap: HTTP %d", in.ID, in.PprofURL, resp.StatusCode)
		}
		if in.Service == "console" {
			continue // the console's pages answer any path with their own 404 or login
		}
		resp, err = hc.Get(in.URL + "/debug/pprof/heap") //nolint:noctx // test
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: profiles on the HTTP listener: HTTP %d, want 404", in.ID, resp.StatusCode)
		}
	}

	// Every service's session on PostgreSQL is encrypted.
	admin := openDB(t, stack.DSN["workorder"])
	var plaintext, encrypted int
	if err := admin.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()`).Scan(&plaintext, &encrypted); err != nil {
		t.Fatal(err)
	}
	if plaintext != 0 || encrypted == 0 {
		t.Errorf("database sessions: %d in plaintext, %d encrypted; want 0 and some", plaintext, encrypted)
	}

	// The console reads the order over mTLS from the services.
	resp, err := hc.Get(urls["console"] + "/api/orders/" + res.OrderIDs[0]) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"status":"INVOICED"`) || strings.Contains(string(body), "unreachable") {
		t.Errorf("console order API over TLS: HTTP %d: %.500s", resp.StatusCode, body)
	}
}
