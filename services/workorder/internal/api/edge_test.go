package api_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// A page token that decodes but names a position no listing can have (a
// time outside what this service ever stored) is refused like garbage.
func TestOutOfRangePageTokenIs400NamingPageToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, raw := range []string{
		`{"t":"0000-01-01T00:00:00Z","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"}`,
		`{"t":"0001-01-01T00:00:00-23:59","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"}`,
		`{"t":"9999-12-31T23:59:59Z","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"}`,
	} {
		tok := base64.RawURLEncoding.EncodeToString([]byte(raw))
		r := b.do(t, http.MethodGet, "/v1/work-orders?"+url.Values{"page_token": {tok}}.Encode(), "", nil)
		if r.code != http.StatusBadRequest {
			t.Errorf("token %s: HTTP %d, want 400: %s", raw, r.code, r.body)
			continue
		}
		if got, _ := rpcError(t, r); !slices.Equal(got, []string{"page_token"}) {
			t.Errorf("token %s: violations %v, want page_token", raw, got)
		}
	}
}

// A NUL byte cannot be stored in PostgreSQL text: it is refused as invalid
// input naming the field, before the database sees it, instead of a 500.
func TestNULByteInFreeTextIs400NamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nulDescription := strings.Replace(validOrder, `"paint the fence"`, `"paint\u0000the fence"`, 1)
	r := b.do(t, http.MethodPost, "/v1/work-orders", nulDescription, nil)
	if got, _ := rpcError(t, r); r.code != http.StatusBadRequest || !slices.Equal(got, []string{"work_order.description"}) {
		t.Fatalf("create: HTTP %d violations %v, want 400 on work_order.description: %s", r.code, got, r.body)
	}
	b.assertNothingStored(t)

	wo := b.create(t, validOrder, nil)
	r = b.do(t, http.MethodPost, "/v1/work-orders/"+wo.GetId()+":cancel", `{"reason":"changed\u0000mind"}`, nil)
	if got, _ := rpcError(t, r); r.code != http.StatusBadRequest || !slices.Equal(got, []string{"reason"}) {
		t.Fatalf("cancel: HTTP %d violations %v, want 400 on reason: %s", r.code, got, r.body)
	}
	o, err := b.repo.Get(context.Background(), uuid.MustParse(wo.GetId()))
	if err != nil || o.Status != "CREATED" || o.Version != 1 {
		t.Fatalf("order after refused cancel: %v v%d %v, want CREATED v1", o.Status, o.Version, err)
	}
}

// PostgreSQL stops under the API: a create answers 503 UNAVAILABLE with
// Retry-After and nothing of the driver's text (a client retrying only
// 503/UNAVAILABLE retries it); once the server is back, the same request
// with its Idempotency-Key creates exactly one order.
func TestCreateDuringDatabaseOutageIs503AndItsRetrySucceeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, pgtest.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Remove)
	admin, err := pgxpool.New(ctx, cluster.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE workorder`); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	dsn := cluster.DSN("workorder")
	if _, err := pgmigrate.ApplyDSN(ctx, dsn, migrations.WorkOrder()...); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setupOn(t, pool)
	b.create(t, validOrder, nil) // the pool holds a live connection

	if err := cluster.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	key := map[string]string{"Idempotency-Key": uuid.NewString()}
	// The first request may meet the pooled connection the shutdown killed,
	// later ones a refused connect: both are the outage.
	for i := range 2 {
		r := b.do(t, http.MethodPost, "/v1/work-orders", validOrder, key)
		if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("create #%d during outage: HTTP %d Retry-After %q, want 503 with Retry-After: %s",
				i+1, r.code, r.header.Get("Retry-After"), r.body)
		}
		var st rpcstatus.Status
		decode(t, r.body, &st)
		if codes.Code(st.GetCode()) != codes.Unavailable {
			t.Fatalf("create #%d: body code %v, want UNAVAILABLE: %s", i+1, codes.Code(st.GetCode()), r.body)
		}
		for _, leak := range []string{"127.0.0.1", "postgres", "user=", "workorder", "dial", "SQLSTATE", "INSERT"} {
			if strings.Contains(string(r.body), leak) {
				t.Errorf("create #%d: body leaks %q: %s", i+1, leak, r.body)
			}
		}
	}

	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wo := b.create(t, validOrder, key)
	if wo.GetStatus() != workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CREATED {
		t.Fatalf("retried create: %v", wo)
	}
	replay := b.create(t, validOrder, key)
	if replay.GetId() != wo.GetId() {
		t.Fatalf("replay returned order %s, want %s", replay.GetId(), wo.GetId())
	}
	for table, want := range map[string]int{"work_orders": 2, "outbox_events": 2, "idempotency_keys": 1} {
		if n := b.count(t, table); n != want {
			t.Errorf("%s = %d, want %d (one before the outage, one retried)", table, n, want)
		}
	}
}
