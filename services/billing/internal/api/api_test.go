package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/billing/internal/api"
	"github.com/lossless-dev/lossless/services/billing/internal/invoice"
	"github.com/lossless-dev/lossless/services/billing/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type testBundle struct {
	pool *pgxpool.Pool
	base string
	grpc billingv1.BillingServiceClient
	conn *grpc.ClientConn // without credentials
}

func setup(t *testing.T) testBundle {
	t.Helper()
	return setupOn(t, pgtest.NewPool(t, migrations.Billing()...))
}

// setupOn serves the API over pool, authentication off (AUTH_DISABLED: the
// anonymous caller reads every customer's invoices; the matrix,
// authz_test.go, authenticates).
func setupOn(t *testing.T, pool *pgxpool.Pool) testBundle {
	t.Helper()
	return setupAuth(t, pool, server.AnonymousAuthenticator{}, authz.Clients{server.AnonymousCaller.Subject: authz.All()})
}

// setupAuth serves the API over pool as the app assembles it: callers
// authenticated by auth, authorized by the policy for clients.
func setupAuth(t *testing.T, pool *pgxpool.Pool, auth server.Authenticator, clients authz.Clients) testBundle {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	svc, err := api.NewService(pool, logger)
	if err != nil {
		t.Fatal(err)
	}
	az, err := authz.New(authz.Infrastructure().Merge(api.Policy()), authz.Config{Clients: clients}, logger)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, logger,
		append([]server.Option{server.WithCallerAuth(auth)}, az.ServerOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := api.Register(ctx, srv, svc); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server shutdown: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testBundle{pool: pool, base: "http://" + srv.HTTPAddr(), grpc: billingv1.NewBillingServiceClient(conn), conn: conn}
}

// issue stores an invoice for a new order, as the invoice job's completion would.
func (b testBundle) issue(t *testing.T, at time.Time) invoice.Invoice {
	t.Helper()
	return b.issueFor(t, "cust-1", at)
}

// issueFor stores an invoice of customer for a new order.
func (b testBundle) issueFor(t *testing.T, customer string, at time.Time) invoice.Invoice {
	t.Helper()
	ctx := context.Background()
	order := invoice.Order{WorkOrderID: uuid.New(), CustomerID: customer, Description: "paint",
		CompletedItems: 2, Currency: "EUR", UnitPriceMinor: 1000}
	inv, err := invoice.Compute(uuid.New(), order, at)
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var jobID int64
		if err := tx.QueryRow(ctx, `INSERT INTO leasequeue_jobs (queue, unique_key, payload, state, max_attempts, due_at, epoch)
			VALUES ('invoices', $1, '', 'done', 10, now(), 1) RETURNING id`, order.WorkOrderID.String()).Scan(&jobID); err != nil {
			return err
		}
		var inserted bool
		inv.Number, inserted, err = store.InsertInvoice(ctx, tx, inv, jobID, "ev-1")
		if !inserted && err == nil {
			t.Fatal("not inserted")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func violations(t *testing.T, err error) []string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code %v (%v), want INVALID_ARGUMENT", st.Code(), err)
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

func TestGetInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	inv := b.issue(t, time.Date(2026, 4, 1, 10, 0, 0, 0, time.UTC))
	resp, err := b.grpc.GetInvoice(ctx, &billingv1.GetInvoiceRequest{Id: inv.ID.String()})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetInvoice()
	if got.GetNumber() != inv.Number || got.GetTotal().GetMinorUnits() != 2000 || len(got.GetLines()) != 1 ||
		got.GetLines()[0].GetAmount().GetMinorUnits() != 2000 || got.GetWorkOrderId() != inv.WorkOrderID.String() {
		t.Fatalf("%v", got)
	}
	if _, err := b.grpc.GetInvoice(ctx, &billingv1.GetInvoiceRequest{Id: uuid.NewString()}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown invoice: %v, want NOT_FOUND", err)
	}
	if f := violations(t, func() error {
		_, err := b.grpc.GetInvoice(ctx, &billingv1.GetInvoiceRequest{Id: "not-a-uuid"})
		return err
	}()); !slices.Equal(f, []string{"id"}) {
		t.Fatalf("violations %v", f)
	}
}

func TestRESTErrorsAndList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inv := b.issue(t, time.Date(2026, 4, 1, 10, 0, 0, 0, time.UTC))
	b.issue(t, time.Date(2026, 4, 2, 10, 0, 0, 0, time.UTC))
	get := func(path string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, b.base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(data, &body); err != nil {
			t.Fatalf("%s: %s", path, data)
		}
		return resp.StatusCode, body
	}
	fieldsOf := func(body map[string]any) []string {
		var out []string
		details, _ := body["details"].([]any)
		for _, d := range details {
			fvs, _ := d.(map[string]any)["fieldViolations"].([]any)
			for _, fv := range fvs {
				out = append(out, fv.(map[string]any)["field"].(string))
			}
		}
		slices.Sort(out)
		return out
	}
	if code, body := get("/v1/invoices/nope"); code != http.StatusBadRequest || !slices.Equal(fieldsOf(body), []string{"id"}) {
		t.Fatalf("bad uuid: %d %v", code, body)
	}
	if code, body := get("/v1/invoices?work_order_id=x&page_size=501"); code != http.StatusBadRequest ||
		!slices.Equal(fieldsOf(body), []string{"page_size", "work_order_id"}) {
		t.Fatalf("bad list: %d %v", code, body)
	}
	if code, body := get("/v1/invoices?issued_after=2026-04-02T00:00:00Z&issued_before=2026-04-01T00:00:00Z"); code != http.StatusBadRequest {
		t.Fatalf("bad time range: %d %v", code, body)
	} else if f := fieldsOf(body); len(f) != 1 {
		t.Fatalf("bad time range violations: %v", body)
	}
	if code, _ := get("/v1/invoices/" + uuid.NewString()); code != http.StatusNotFound {
		t.Fatalf("unknown invoice: %d", code)
	}
	code, body := get("/v1/invoices?work_order_id=" + inv.WorkOrderID.String())
	if code != http.StatusOK {
		t.Fatalf("list: %d %v", code, body)
	}
	list, _ := body["invoices"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["number"] != inv.Number {
		t.Fatalf("list by work order: %v", body)
	}
}

func TestListPagesByTimeRangeNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	base := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	var want []string
	for i := range 7 {
		inv := b.issue(t, base.Add(time.Duration(i)*time.Hour))
		if i >= 1 && i < 6 {
			want = append([]string{inv.Number}, want...)
		}
	}
	var got []string
	token := ""
	for {
		resp, err := b.grpc.ListInvoices(ctx, &billingv1.ListInvoicesRequest{
			IssuedAfter: timestamppb.New(base.Add(time.Hour)), IssuedBefore: timestamppb.New(base.Add(6 * time.Hour)),
			PageSize: 2, PageToken: token,
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, inv := range resp.GetInvoices() {
			got = append(got, inv.GetNumber())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages %v, want %v", got, want)
	}
	if f := violations(t, func() error {
		_, err := b.grpc.ListInvoices(ctx, &billingv1.ListInvoicesRequest{PageToken: "garbage!"})
		return err
	}()); !slices.Equal(f, []string{"page_token"}) {
		t.Fatalf("bad token violations %v", f)
	}
}
