package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/api"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

// testBundle is one test's service, served on loopback gRPC + HTTP (gateway)
// exactly as in production, on its own database.
type testBundle struct {
	pool *pgxpool.Pool
	repo *orders.Repository
	base string                             // http://127.0.0.1:port
	grpc workorderv1.WorkOrderServiceClient // calls as testCaller
	conn *grpc.ClientConn                   // without credentials
	// issuer mints the callers' tokens; the server verifies them over
	// HTTP (discovery, JWKS) as in production.
	issuer *localissuer.Issuer
}

// The callers of the tests: testCaller by default, operatorCaller in
// WORKORDER_OPERATOR_SUBJECTS.
const (
	testCaller     = "alice"
	otherCaller    = "bob"
	operatorCaller = "ops-console"
	testAudience   = "workorder"
)

// testClients is the tests' AUTH_CLIENTS: testCaller and otherCaller act
// for every customer; the matrix's clients (authz_test.go) for one.
var testClients = authz.Clients{
	testCaller: authz.All(), otherCaller: authz.All(),
	clientOfA: authz.Only(customerA), clientOfAll: authz.All(),
}

// token is a valid ID token of subject for the service.
func (b testBundle) token(t testing.TB, subject string) string {
	t.Helper()
	tok, err := b.issuer.Mint(localissuer.Claims{Subject: subject, Audience: testAudience})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// as returns ctx whose gRPC calls carry subject's token.
func (b testBundle) as(t testing.TB, ctx context.Context, subject string) context.Context {
	t.Helper()
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+b.token(t, subject))
}

// bearer is the Authorization header of subject.
func (b testBundle) bearer(t testing.TB, subject string) map[string]string {
	t.Helper()
	return map[string]string{"Authorization": "Bearer " + b.token(t, subject)}
}

func setup(t testing.TB) testBundle {
	t.Helper()
	return setupOn(t, pgtest.NewPool(t, migrations.WorkOrder()...))
}

// setupOn serves the API over pool, a migrated work-order database.
func setupOn(t testing.TB, pool *pgxpool.Pool) testBundle {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	repo, err := orders.NewRepository(pool)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idempotency.NewStore(pool, idempotency.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := api.NewService(pool, repo, keys, []string{operatorCaller}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	issuerSrv := httptest.NewUnstartedServer(nil)
	issuer, err := localissuer.New("http://"+issuerSrv.Listener.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	issuerSrv.Config.Handler = issuer.Handler()
	issuerSrv.Start()
	t.Cleanup(issuerSrv.Close)
	verifier, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: issuer.URL(), Audience: testAudience}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// As the app assembles it (internal/serviceapp): the policy, AUTH_CLIENTS
	// (testClients) and the operators as clients of every customer.
	az, err := authz.New(authz.Infrastructure().Merge(api.Policy()),
		authz.Config{Clients: testClients.With(authz.All(), operatorCaller)}, logger)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, logger,
		append([]server.Option{server.WithCallerAuth(verifier)}, az.ServerOptions()...)...)
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
	b := testBundle{pool: pool, repo: repo, base: "http://" + srv.HTTPAddr(), conn: conn, issuer: issuer}
	authed, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(server.TokenCredentials(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: b.token(t, testCaller)}), false)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = authed.Close() })
	b.grpc = workorderv1.NewWorkOrderServiceClient(authed)
	return b
}

type response struct {
	code   int
	body   []byte
	header http.Header
}

func (b testBundle) do(t testing.TB, method, path, body string, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, b.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// testCaller's token unless the test sets Authorization ("" sends none).
	if _, ok := header["Authorization"]; !ok {
		req.Header.Set("Authorization", "Bearer "+b.token(t, testCaller))
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, body: data, header: resp.Header}
}

const validOrder = `{"customer_id":"acme-1","description":"paint the fence","positions":3,"unit_price":{"currency_code":"EUR","minor_units":1250}}`

func (b testBundle) create(t testing.TB, body string, header map[string]string) *workorderv1.WorkOrder {
	t.Helper()
	r := b.do(t, http.MethodPost, "/v1/work-orders", body, header)
	if r.code != http.StatusOK {
		t.Fatalf("create: HTTP %d: %s", r.code, r.body)
	}
	var out workorderv1.CreateWorkOrderResponse
	decode(t, r.body, &out)
	return out.GetWorkOrder()
}

func decode(t testing.TB, body []byte, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(body, m); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
}

// rpcError decodes the gateway's error body: the google.rpc.Status.
func rpcError(t *testing.T, r response) (violations []string, reason string) {
	t.Helper()
	var st rpcstatus.Status
	decode(t, r.body, &st)
	for _, d := range st.GetDetails() {
		m, err := d.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *errdetails.BadRequest:
			for _, v := range m.GetFieldViolations() {
				violations = append(violations, v.GetField())
			}
		case *errdetails.ErrorInfo:
			reason = m.GetReason()
		}
	}
	slices.Sort(violations)
	return violations, reason
}

func (b testBundle) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b testBundle) assertNothingStored(t *testing.T) {
	t.Helper()
	for _, table := range []string{"work_orders", "work_order_transitions", "outbox_events", "idempotency_keys"} {
		if n := b.count(t, table); n != 0 {
			t.Errorf("%s has %d rows after a rejected request, want 0", table, n)
		}
	}
}

func TestCreateWithInvalidFieldsIs400NamingEachFieldAndStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name   string
		body   string
		header map[string]string
		want   []string
	}{
		{
			name: "several bad fields",
			body: `{"customer_id":"","description":"","positions":0,"unit_price":{"currency_code":"eur","minor_units":-1}}`,
			want: []string{"work_order.customer_id", "work_order.description", "work_order.positions",
				"work_order.unit_price.currency_code", "work_order.unit_price.minor_units"},
		},
		{
			name: "missing price, too many positions",
			body: `{"customer_id":"acme","description":"x","positions":100001}`,
			want: []string{"work_order.positions", "work_order.unit_price"},
		},
		{
			name: "empty work order",
			body: `{}`,
			want: []string{"work_order.customer_id", "work_order.description", "work_order.positions", "work_order.unit_price"},
		},
		{
			name:   "invalid idempotency key with a valid body",
			body:   validOrder,
			header: map[string]string{"Idempotency-Key": "has spaces in it"},
			want:   []string{"idempotency-key"},
		},
		{
			name:   "bad fields with a valid key",
			body:   `{"customer_id":"-bad","description":"x","positions":1,"unit_price":{"currency_code":"EUR","minor_units":1}}`,
			header: map[string]string{"Idempotency-Key": uuid.NewString()},
			want:   []string{"work_order.customer_id"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, http.MethodPost, "/v1/work-orders", tc.body, tc.header)
			if r.code != http.StatusBadRequest {
				t.Fatalf("HTTP %d, want 400: %s", r.code, r.body)
			}
			got, _ := rpcError(t, r)
			got = slices.Compact(got) // one entry per failed rule; a field may fail two
			if !slices.Equal(got, tc.want) {
				t.Logf("body: %s", r.body)
				t.Fatalf("field violations %v, want %v", got, tc.want)
			}
			b.assertNothingStored(t)
		})
	}
}

func TestCreateStoresTheOrderItsTransitionAndOneHandOffEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Output-only fields sent by the client are ignored (AIP-203).
	body := `{"id":"not-ours","status":"WORK_ORDER_STATUS_INVOICED","version":42,"invoice_id":"x",` + validOrder[1:]
	wo := b.create(t, body, nil)
	if _, err := uuid.Parse(wo.GetId()); err != nil || wo.GetId() == "not-ours" {
		t.Fatalf("id %q is not server-assigned", wo.GetId())
	}
	if wo.GetStatus() != workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CREATED || wo.GetVersion() != 1 || wo.GetInvoiceId() != "" {
		t.Fatalf("created order %v", wo)
	}
	if wo.GetCustomerId() != "acme-1" || wo.GetPositions() != 3 || wo.GetUnitPrice().GetMinorUnits() != 1250 || wo.GetCreateTime() == nil {
		t.Fatalf("created order %v", wo)
	}

	// I1: exactly one hand-off event for the order, in the same database,
	// still to deliver (no relay runs here).
	if n := b.count(t, "outbox_events"); n != 1 {
		t.Fatalf("outbox events = %d, want 1", n)
	}
	var (
		aggType, aggID, evType, status string
		payload                        []byte
	)
	if err := b.pool.QueryRow(context.Background(),
		`SELECT aggregate_type, aggregate_id, event_type, status, payload FROM outbox_events`).
		Scan(&aggType, &aggID, &evType, &status, &payload); err != nil {
		t.Fatal(err)
	}
	if aggType != "work_order" || aggID != wo.GetId() || evType != "lossless.events.v1.WorkOrderHandOffRequested" || status != "PENDING" {
		t.Fatalf("outbox row: %s %s %s %s", aggType, aggID, evType, status)
	}
	var ev eventsv1.WorkOrderHandOffRequested
	if err := proto.Unmarshal(payload, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.GetWorkOrderId() != wo.GetId() || ev.GetPositions() != 3 || ev.GetEventId() == "" {
		t.Fatalf("payload %v", &ev)
	}
	if n := b.count(t, "work_order_transitions"); n != 1 {
		t.Fatalf("transitions = %d, want 1", n)
	}
}

func TestGetUnknownOrderIs404(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := uuid.NewString()
	for _, path := range []string{"/v1/work-orders/" + id, "/v1/work-orders/" + id + "/history"} {
		if r := b.do(t, http.MethodGet, path, "", nil); r.code != http.StatusNotFound {
			t.Errorf("GET %s: HTTP %d, want 404: %s", path, r.code, r.body)
		}
	}
	if r := b.do(t, http.MethodPost, "/v1/work-orders/"+id+":cancel", `{}`, nil); r.code != http.StatusNotFound {
		t.Errorf("cancel: HTTP %d, want 404: %s", r.code, r.body)
	}
	r := b.do(t, http.MethodGet, "/v1/work-orders/not-a-uuid", "", nil)
	if got, _ := rpcError(t, r); r.code != http.StatusBadRequest || !slices.Equal(got, []string{"id"}) {
		t.Errorf("malformed id: HTTP %d violations %v", r.code, got)
	}

	wo := b.create(t, validOrder, nil)
	r = b.do(t, http.MethodGet, "/v1/work-orders/"+wo.GetId(), "", nil)
	var got workorderv1.GetWorkOrderResponse
	decode(t, r.body, &got)
	if r.code != http.StatusOK || !proto.Equal(got.GetWorkOrder(), wo) {
		t.Fatalf("get: HTTP %d %v, want %v", r.code, got.GetWorkOrder(), wo)
	}
}

func TestIdempotentReplayReturnsTheOriginalResponseAndCreatesOneOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := uuid.NewString()
	first := b.do(t, http.MethodPost, "/v1/work-orders", validOrder, map[string]string{"Idempotency-Key": key})
	// The draft's quoted Structured Field form names the same key; a
	// different field order is the same request.
	reordered := `{"positions":3,"unit_price":{"minor_units":1250,"currency_code":"EUR"},"description":"paint the fence","customer_id":"acme-1"}`
	second := b.do(t, http.MethodPost, "/v1/work-orders", reordered, map[string]string{"Idempotency-Key": `"` + key + `"`})
	if first.code != http.StatusOK || second.code != http.StatusOK {
		t.Fatalf("HTTP %d then %d: %s", first.code, second.code, second.body)
	}
	var a, c workorderv1.CreateWorkOrderResponse
	decode(t, first.body, &a)
	decode(t, second.body, &c)
	if !proto.Equal(&a, &c) {
		t.Fatalf("replay %v differs from original %v", &c, &a)
	}
	if second.header.Get("Grpc-Metadata-Idempotent-Replayed") != "true" || first.header.Get("Grpc-Metadata-Idempotent-Replayed") != "" {
		t.Errorf("replayed header: first %q, second %q", first.header.Get("Grpc-Metadata-Idempotent-Replayed"), second.header.Get("Grpc-Metadata-Idempotent-Replayed"))
	}
	for table, want := range map[string]int{"work_orders": 1, "outbox_events": 1, "idempotency_keys": 1} {
		if n := b.count(t, table); n != want {
			t.Errorf("%s = %d, want %d", table, n, want)
		}
	}
	// Without a key, the same body is a new order.
	b.create(t, validOrder, nil)
	if n := b.count(t, "work_orders"); n != 2 {
		t.Fatalf("work_orders = %d, want 2", n)
	}
}

func TestSameIdempotencyKeyWithADifferentBodyIs422(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := uuid.NewString()
	b.create(t, validOrder, map[string]string{"Idempotency-Key": key})
	other := strings.Replace(validOrder, `"positions":3`, `"positions":4`, 1)
	r := b.do(t, http.MethodPost, "/v1/work-orders", other, map[string]string{"Idempotency-Key": key})
	if r.code != http.StatusUnprocessableEntity {
		t.Fatalf("HTTP %d, want 422: %s", r.code, r.body)
	}
	if _, reason := rpcError(t, r); reason != apierror.ReasonIdempotencyKeyMismatch {
		t.Fatalf("reason %q", reason)
	}
	if n := b.count(t, "work_orders"); n != 1 {
		t.Fatalf("work_orders = %d, want 1", n)
	}
}

// Concurrent creates with one key: one order; every response is that order
// (replay) or 409 while the first is in flight. Repeated, since a race does
// not lose every time.
func TestConcurrentCreatesWithOneIdempotencyKeyCreateOneOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rounds, clients = 20, 8
	for round := range rounds {
		key := uuid.NewString()
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			ids = map[string]int{}
		)
		for range clients {
			wg.Go(func() {
				r := b.do(t, http.MethodPost, "/v1/work-orders", validOrder, map[string]string{"Idempotency-Key": key})
				switch r.code {
				case http.StatusOK:
					var out workorderv1.CreateWorkOrderResponse
					decode(t, r.body, &out)
					mu.Lock()
					ids[out.GetWorkOrder().GetId()]++
					mu.Unlock()
				case http.StatusConflict:
					if _, reason := rpcError(t, r); reason != apierror.ReasonIdempotencyKeyInFlight {
						t.Errorf("409 with reason %q", reason)
					}
				default:
					t.Errorf("HTTP %d: %s", r.code, r.body)
				}
			})
		}
		wg.Wait()
		if len(ids) != 1 {
			t.Fatalf("round %d: responses name %d different orders: %v", round, len(ids), ids)
		}
		if n := b.count(t, "work_orders"); n != round+1 {
			t.Fatalf("round %d: work_orders = %d, want %d", round, n, round+1)
		}
	}
	if n := b.count(t, "outbox_events"); n != rounds {
		t.Fatalf("outbox events = %d, want %d", n, rounds)
	}
}

func TestCancelBeforeHandOffCancelsAndIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wo := b.create(t, validOrder, nil)
	for i := range 2 {
		r := b.do(t, http.MethodPost, "/v1/work-orders/"+wo.GetId()+":cancel", `{"reason":"customer changed their mind"}`, nil)
		if r.code != http.StatusOK {
			t.Fatalf("cancel #%d: HTTP %d: %s", i+1, r.code, r.body)
		}
		var out workorderv1.CancelWorkOrderResponse
		decode(t, r.body, &out)
		if out.GetWorkOrder().GetStatus() != workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CANCELLED || out.GetWorkOrder().GetVersion() != 2 {
			t.Fatalf("cancel #%d: %v", i+1, out.GetWorkOrder())
		}
	}
	r := b.do(t, http.MethodGet, "/v1/work-orders/"+wo.GetId()+"/history", "", nil)
	var h workorderv1.ListWorkOrderHistoryResponse
	decode(t, r.body, &h)
	got := make([]string, 0, len(h.GetTransitions()))
	for _, tr := range h.GetTransitions() {
		if tr.GetTime() == nil {
			t.Errorf("transition without time: %v", tr)
		}
		got = append(got, fmt.Sprintf("%s>%s %s", tr.GetFromStatus(), tr.GetToStatus(), tr.GetCause()))
	}
	want := []string{
		"WORK_ORDER_STATUS_UNSPECIFIED>WORK_ORDER_STATUS_CREATED api:create",
		"WORK_ORDER_STATUS_CREATED>WORK_ORDER_STATUS_CANCELLED api:cancel: customer changed their mind",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("history %q, want %q", got, want)
	}
}

func TestCancelAfterHandOffIsFailedPrecondition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wo := b.create(t, validOrder, nil)
	id := uuid.MustParse(wo.GetId())
	if _, err := b.repo.Update(context.Background(), id, func(o *orders.Order) error {
		o.AcceptHandOff("job-1", uuid.NewString())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := b.do(t, http.MethodPost, "/v1/work-orders/"+wo.GetId()+":cancel", `{}`, nil)
	if r.code != http.StatusBadRequest {
		t.Fatalf("HTTP %d, want 400 (FAILED_PRECONDITION): %s", r.code, r.body)
	}
	if _, reason := rpcError(t, r); reason != api.ReasonNotCancellable {
		t.Fatalf("reason %q", reason)
	}
	o, err := b.repo.Get(context.Background(), id)
	if err != nil || o.Status != orders.StatusHandedOff {
		t.Fatalf("order after refused cancel: %v %v", o.Status, err)
	}
}

func TestListPagesNewestFirstAndFiltersByStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var created []string
	for range 7 {
		created = append(created, b.create(t, validOrder, nil).GetId())
	}
	slices.Reverse(created) // newest first
	for _, id := range []string{created[1], created[4]} {
		if r := b.do(t, http.MethodPost, "/v1/work-orders/"+id+":cancel", `{}`, nil); r.code != http.StatusOK {
			t.Fatalf("cancel: HTTP %d", r.code)
		}
	}

	list := func(query url.Values) ([]string, string) {
		t.Helper()
		r := b.do(t, http.MethodGet, "/v1/work-orders?"+query.Encode(), "", nil)
		if r.code != http.StatusOK {
			t.Fatalf("list %v: HTTP %d: %s", query, r.code, r.body)
		}
		var out workorderv1.ListWorkOrdersResponse
		decode(t, r.body, &out)
		var ids []string
		for _, wo := range out.GetWorkOrders() {
			ids = append(ids, wo.GetId())
		}
		return ids, out.GetNextPageToken()
	}

	var all []string
	var pages []int
	token := ""
	for {
		ids, next := list(url.Values{"page_size": {"3"}, "page_token": {token}})
		all = append(all, ids...)
		pages = append(pages, len(ids))
		if next == "" {
			break
		}
		token = next
	}
	if !slices.Equal(all, created) || !slices.Equal(pages, []int{3, 3, 1}) {
		t.Fatalf("paged %v (pages %v), want %v", all, pages, created)
	}

	cancelled, next := list(url.Values{"status": {"WORK_ORDER_STATUS_CANCELLED"}, "page_size": {"1"}})
	if !slices.Equal(cancelled, []string{created[1]}) || next == "" {
		t.Fatalf("cancelled page 1: %v next %q", cancelled, next)
	}
	cancelled, next2 := list(url.Values{"status": {"WORK_ORDER_STATUS_CANCELLED"}, "page_size": {"1"}, "page_token": {next}})
	if !slices.Equal(cancelled, []string{created[4]}) {
		t.Fatalf("cancelled page 2: %v", cancelled)
	}
	if next2 != "" {
		if rest, _ := list(url.Values{"status": {"WORK_ORDER_STATUS_CANCELLED"}, "page_token": {next2}}); len(rest) != 0 {
			t.Fatalf("cancelled page 3: %v", rest)
		}
	}

	// A token belongs to its filter; garbage is not a token.
	for _, q := range []url.Values{
		{"status": {"WORK_ORDER_STATUS_CREATED"}, "page_token": {next}},
		{"page_token": {"bm90IGEgdG9rZW4"}},
		{"page_size": {"501"}},
	} {
		r := b.do(t, http.MethodGet, "/v1/work-orders?"+q.Encode(), "", nil)
		if r.code != http.StatusBadRequest {
			t.Errorf("list %v: HTTP %d, want 400", q, r.code)
		}
	}
}

func TestGRPCAndRESTShareValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A JSON body the gateway cannot parse never reaches the service.
	r := b.do(t, http.MethodPost, "/v1/work-orders", `{"positions":"many"`, nil)
	if r.code != http.StatusBadRequest {
		t.Fatalf("malformed JSON: HTTP %d", r.code)
	}
	if !bytes.Contains(r.body, []byte(`"code"`)) {
		t.Fatalf("malformed JSON: body is not a google.rpc.Status: %s", r.body)
	}
	b.assertNothingStored(t)
}

func TestGRPCCreateWithoutWorkOrderOrWithTwoKeysIsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.grpc.CreateWorkOrder(ctx, &workorderv1.CreateWorkOrderRequest{})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "work_order") {
		t.Fatalf("no work order: %v", err)
	}
	two := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "a", "idempotency-key", "b")
	var wo workorderv1.WorkOrder
	decode(t, []byte(validOrder), &wo)
	_, err = b.grpc.CreateWorkOrder(two, &workorderv1.CreateWorkOrderRequest{WorkOrder: &wo})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "idempotency-key") {
		t.Fatalf("two keys: %v", err)
	}
	b.assertNothingStored(t)
}
