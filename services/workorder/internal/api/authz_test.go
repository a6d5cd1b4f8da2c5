package api_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/pkg/authz"
)

// The matrix's callers (testClients) and customers.
const (
	clientOfA   = "client-a"   // AUTH_CLIENTS client-a=cust-a
	clientOfAll = "client-all" // AUTH_CLIENTS client-all=*
	unlisted    = "stranger"   // verified, not in AUTH_CLIENTS
	peerCaller  = "provider-sim"
	customerA   = "cust-a"
	customerB   = "cust-b"
)

// A caller kind of the matrix: whose token, and the customer its request
// is for (the order it names is that customer's).
type callerKind struct {
	name     string
	subject  string // "" sends no token
	audience string // default testAudience
	customer string
}

var callerKinds = []callerKind{
	{name: "no token", customer: customerA},
	{name: "wrong audience", subject: clientOfA, audience: "billing", customer: customerA},
	{name: "unlisted account", subject: unlisted, customer: customerA},
	{name: "peer", subject: peerCaller, customer: customerA},
	{name: "client of A for A", subject: clientOfA, customer: customerA},
	{name: "client of A for B", subject: clientOfA, customer: customerB},
	{name: "client * for B", subject: clientOfAll, customer: customerB},
}

// authzMatrix is the expected code of every WorkOrderService method for
// every caller kind (docs/adr/0025-authorization.md has the same table).
var authzMatrix = map[string]map[string]codes.Code{
	"CreateWorkOrder":      {"client of A for A": codes.OK, "client of A for B": codes.PermissionDenied, "client * for B": codes.OK},
	"GetWorkOrder":         {"client of A for A": codes.OK, "client of A for B": codes.NotFound, "client * for B": codes.OK},
	"ListWorkOrders":       {"client of A for A": codes.OK, "client of A for B": codes.OK, "client * for B": codes.OK},
	"CancelWorkOrder":      {"client of A for A": codes.OK, "client of A for B": codes.NotFound, "client * for B": codes.OK},
	"ListWorkOrderHistory": {"client of A for A": codes.OK, "client of A for B": codes.NotFound, "client * for B": codes.OK},
}

// expected is the matrix's code; the kinds refused before any rule of the
// method are the same for every method.
func expected(method, kind string) (codes.Code, bool) {
	switch kind {
	case "no token", "wrong audience":
		return codes.Unauthenticated, true
	case "unlisted account", "peer":
		return codes.PermissionDenied, true
	}
	c, ok := authzMatrix[method][kind]
	return c, ok
}

// TestAuthorizationMatrix calls every method of the public service, as its
// descriptor lists them, as every caller kind, against the server with
// real PostgreSQL; a method missing from the matrix fails.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The orders the per-order methods name: each customer's, created by
	// the client that may use it (creator rule, ADR 0017).
	owner := map[string]string{customerA: clientOfA, customerB: clientOfAll}
	newOrder := func(customer string) string {
		body := strings.Replace(validOrder, `"acme-1"`, `"`+customer+`"`, 1)
		return b.create(t, body, b.bearer(t, owner[customer])).GetId()
	}
	for _, m := range publicMethods(t) {
		name := string(m.Name())
		full := "/" + string(m.Parent().FullName()) + "/" + name
		if _, ok := authzMatrix[name]; !ok {
			t.Errorf("%s has no entry in the authorization matrix", full)
			continue
		}
		for _, k := range callerKinds {
			want, ok := expected(name, k.name)
			if !ok {
				t.Errorf("%s: no expectation for %s", full, k.name)
				continue
			}
			ctx := context.Background()
			if k.subject != "" {
				aud := k.audience
				if aud == "" {
					aud = testAudience
				}
				tok, err := b.issuer.Mint(localissuer.Claims{Subject: k.subject, Audience: aud})
				if err != nil {
					t.Fatal(err)
				}
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			}
			var req proto.Message
			switch name {
			case "CreateWorkOrder":
				req = &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{CustomerId: k.customer,
					Description: "matrix", Positions: 1, UnitPrice: validPrice()}}
			case "ListWorkOrders":
				req = &workorderv1.ListWorkOrdersRequest{}
			case "GetWorkOrder":
				req = &workorderv1.GetWorkOrderRequest{Id: newOrder(k.customer)}
			case "CancelWorkOrder":
				req = &workorderv1.CancelWorkOrderRequest{Id: newOrder(k.customer)}
			case "ListWorkOrderHistory":
				req = &workorderv1.ListWorkOrderHistoryRequest{Id: newOrder(k.customer)}
			default:
				t.Errorf("%s: the matrix test does not know how to call it", full)
				continue
			}
			out := responseFor(t, name)
			err := b.conn.Invoke(ctx, full, req, out)
			if got := status.Code(err); got != want {
				t.Errorf("%s as %s: %v, want %v", full, k.name, err, want)
				continue
			}
			// The effect: a listing shows only the caller's customers.
			if l, ok := out.(*workorderv1.ListWorkOrdersResponse); ok && err == nil && k.subject == clientOfA {
				for _, o := range l.GetWorkOrders() {
					if o.GetCustomerId() != customerA {
						t.Errorf("%s as %s lists customer %s's order", full, k.name, o.GetCustomerId())
					}
				}
			}
		}
	}
	// Nothing was written for a customer by a client not acting for it.
	var n int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM work_orders WHERE customer_id = $1 AND created_by <> $2`, customerB, clientOfAll).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d orders of %s created by another client (%v), want 0", n, customerB, err)
	}
}

func responseFor(t *testing.T, method string) proto.Message {
	t.Helper()
	switch method {
	case "CreateWorkOrder":
		return &workorderv1.CreateWorkOrderResponse{}
	case "ListWorkOrders":
		return &workorderv1.ListWorkOrdersResponse{}
	}
	return responseOf(map[string]string{"GetWorkOrder": "get", "CancelWorkOrder": "cancel", "ListWorkOrderHistory": "history"}[method])
}

func validPrice() *moneyv1.Money {
	return &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 1250}
}

// A create for another customer is refused before anything is written,
// the idempotency key included, with a field violation naming
// customer_id; through the gateway it is HTTP 403.
func TestCreateForAnotherCustomerIsRefusedWithItsField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := strings.Replace(validOrder, `"acme-1"`, `"`+customerB+`"`, 1)
	hdr := b.bearer(t, clientOfA)
	hdr["Idempotency-Key"] = "refused-1"
	r := b.do(t, http.MethodPost, "/v1/work-orders", body, hdr)
	if r.code != http.StatusForbidden {
		t.Fatalf("HTTP %d %s, want 403", r.code, r.body)
	}
	violations, reason := rpcError(t, r)
	if reason != authz.ReasonCustomerNotAllowed || !slices.Contains(violations, "work_order.customer_id") {
		t.Fatalf("reason %q, violations %v; want %s on work_order.customer_id", reason, violations, authz.ReasonCustomerNotAllowed)
	}
	if n := countRows(t, b, "work_orders"); n != 0 {
		t.Fatalf("%d orders after a refused create", n)
	}
	if n := countRows(t, b, "idempotency_keys"); n != 0 {
		t.Fatalf("%d idempotency keys after a refused create", n)
	}
	// The same key, for its own customer, creates the order.
	own := b.create(t, strings.Replace(validOrder, `"acme-1"`, `"`+customerA+`"`, 1), hdr)
	if own.GetCustomerId() != customerA || own.GetCreator() != clientOfA {
		t.Fatalf("created %s for %s by %s", own.GetId(), own.GetCustomerId(), own.GetCreator())
	}
}

// Another customer's order is invisible: the same NOT_FOUND (HTTP 404) as
// an unknown id, even to its creator once the creator no longer acts for
// that customer (its AUTH_CLIENTS entry narrowed), and absent from
// listings: filtered in SQL, a page is full while more orders follow.
func TestAnotherCustomersOrderIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	forA := strings.Replace(validOrder, `"acme-1"`, `"`+customerA+`"`, 1)
	older := b.create(t, forA, b.bearer(t, clientOfA))
	newer := b.create(t, forA, b.bearer(t, clientOfA))
	// As if client-a had created it while it acted for cust-b too.
	if _, err := b.pool.Exec(ctx, `UPDATE work_orders SET customer_id = $1 WHERE id = $2`, customerB, newer.GetId()); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/work-orders/" + newer.GetId(), "/v1/work-orders/" + uuid.NewString()} {
		r := b.do(t, http.MethodGet, path, "", b.bearer(t, clientOfA))
		if r.code != http.StatusNotFound {
			t.Fatalf("GET %s: HTTP %d %s, want 404", path, r.code, r.body)
		}
		if _, reason := rpcError(t, r); reason != "" {
			t.Fatalf("reason %q: a NOT_FOUND must not say why", reason)
		}
	}
	var list workorderv1.ListWorkOrdersResponse
	if err := b.conn.Invoke(b.as(t, ctx, clientOfA), workorderv1.WorkOrderService_ListWorkOrders_FullMethodName,
		&workorderv1.ListWorkOrdersRequest{PageSize: 1}, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.GetWorkOrders()) != 1 || list.GetWorkOrders()[0].GetId() != older.GetId() || list.GetNextPageToken() != "" {
		t.Fatalf("client-a's first page: %v next %q, want only %s and no next page", list.GetWorkOrders(), list.GetNextPageToken(), older.GetId())
	}
	// A client of every customer who created it still sees it.
	if err := b.conn.Invoke(b.as(t, ctx, operatorCaller), workorderv1.WorkOrderService_ListWorkOrders_FullMethodName,
		&workorderv1.ListWorkOrdersRequest{}, &list); err != nil || len(list.GetWorkOrders()) != 2 {
		t.Fatalf("operator's listing: %d (%v), want 2", len(list.GetWorkOrders()), err)
	}
}
