package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
)

// publicMethods are the public service's methods, read from its descriptor:
// a method added later is covered without editing the test.
func publicMethods(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	sd := workorderv1.File_lossless_workorder_v1_workorder_proto.Services().ByName("WorkOrderService")
	var out []protoreflect.MethodDescriptor
	for i := range sd.Methods().Len() {
		out = append(out, sd.Methods().Get(i))
	}
	if len(out) < 5 {
		t.Fatalf("found %d methods, want the service's 5 or more", len(out))
	}
	return out
}

// restRoute returns the method's HTTP verb and path (path parameters
// filled with a UUID).
func restRoute(t *testing.T, m protoreflect.MethodDescriptor) (string, string) {
	t.Helper()
	rule, _ := proto.GetExtension(m.Options(), annotations.E_Http).(*annotations.HttpRule)
	if rule == nil {
		t.Fatalf("%s has no HTTP route", m.FullName())
	}
	var verb, path string
	switch p := rule.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		verb, path = http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		verb, path = http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		verb, path = http.MethodPut, p.Put
	case *annotations.HttpRule_Delete:
		verb, path = http.MethodDelete, p.Delete
	case *annotations.HttpRule_Patch:
		verb, path = http.MethodPatch, p.Patch
	default:
		t.Fatalf("%s: unsupported HTTP rule %v", m.FullName(), rule)
	}
	return verb, strings.ReplaceAll(path, "{id}", uuid.NewString())
}

func TestEveryPublicMethodRefusesACallWithoutToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, m := range publicMethods(t) {
		full := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
		in, out := dynamicpb.NewMessage(m.Input()), dynamicpb.NewMessage(m.Output())
		err := b.conn.Invoke(context.Background(), full, in, out)
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC %s without token: %v, want UNAUTHENTICATED", full, err)
		}
		verb, path := restRoute(t, m)
		r := b.do(t, verb, path, "{}", map[string]string{"Authorization": ""})
		if r.code != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") ||
			!strings.Contains(string(r.body), "authorization") {
			t.Errorf("REST %s %s without token: HTTP %d %q %s, want 401 Bearer and a message", verb, path, r.code,
				r.header.Get("WWW-Authenticate"), r.body)
		}
	}
	if n := countRows(t, b, "work_orders"); n != 0 {
		t.Fatalf("%d orders created by unauthenticated calls", n)
	}
}

func TestRefusedTokensAre401(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wrongAudience, err := b.issuer.Mint(localissuer.Claims{Subject: testCaller, Audience: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := b.issuer.Mint(localissuer.Claims{Subject: testCaller, Audience: testAudience, TTL: -time.Minute}) // past server.ClockLeeway
	if err != nil {
		t.Fatal(err)
	}
	other, err := localissuer.New(b.issuer.URL(), nil) // same iss, another key
	if err != nil {
		t.Fatal(err)
	}
	forged, err := other.Mint(localissuer.Claims{Subject: testCaller, Audience: testAudience})
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"wrong audience": wrongAudience, "expired": expired, "bad signature": forged} {
		r := b.do(t, http.MethodPost, "/v1/work-orders", validOrder, map[string]string{"Authorization": "Bearer " + tok})
		if r.code != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d %s, want 401", name, r.code, r.body)
		}
	}
	if n := countRows(t, b, "work_orders"); n != 0 {
		t.Fatalf("%d orders created with refused tokens", n)
	}
}

func TestSameIdempotencyKeyFromTwoCallersCreatesTwoOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "shared-key-1"
	alice := b.create(t, validOrder, map[string]string{"Idempotency-Key": key, "Authorization": b.bearer(t, testCaller)["Authorization"]})
	// Bob's body differs: with keys shared across callers this would be a
	// 422 telling bob that alice's key exists.
	bobOrder := strings.Replace(validOrder, "paint the fence", "fix the roof", 1)
	bob := b.create(t, bobOrder, map[string]string{"Idempotency-Key": key, "Authorization": b.bearer(t, otherCaller)["Authorization"]})
	if alice.GetId() == bob.GetId() {
		t.Fatalf("both callers got order %s", alice.GetId())
	}
	if alice.GetCreator() != testCaller || bob.GetCreator() != otherCaller {
		t.Fatalf("creators %q, %q; want %q, %q", alice.GetCreator(), bob.GetCreator(), testCaller, otherCaller)
	}
	// Each caller's retry replays its own order.
	again := b.create(t, bobOrder, map[string]string{"Idempotency-Key": key, "Authorization": b.bearer(t, otherCaller)["Authorization"]})
	if again.GetId() != bob.GetId() {
		t.Fatalf("bob's retry got %s, want his %s", again.GetId(), bob.GetId())
	}
	if n := countRows(t, b, "work_orders"); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
	var creator string
	if err := b.pool.QueryRow(context.Background(), `SELECT created_by FROM work_orders WHERE id = $1`, bob.GetId()).Scan(&creator); err != nil || creator != otherCaller {
		t.Fatalf("stored creator %q (%v), want %q", creator, err, otherCaller)
	}
}

func TestOnlyTheCreatorOrAnOperatorUsesAnOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	order := b.create(t, validOrder, nil) // testCaller's
	id := order.GetId()
	ctx := context.Background()

	// Another caller: 403 on every per-order method, and an empty listing.
	for _, name := range []string{"get", "history", "cancel"} {
		// b.grpc sends testCaller's token: call on the bare connection.
		err := b.conn.Invoke(b.as(t, ctx, otherCaller), methodOf(name), requestOf(name, id), responseOf(name))
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s by another caller: %v, want PERMISSION_DENIED", name, err)
		}
	}
	r := b.do(t, http.MethodPost, "/v1/work-orders/"+id+":cancel", "{}", b.bearer(t, otherCaller))
	if r.code != http.StatusForbidden {
		t.Fatalf("REST cancel by another caller: HTTP %d %s, want 403", r.code, r.body)
	}
	if o, err := b.repo.Get(ctx, uuid.MustParse(id)); err != nil || o.Status != "CREATED" {
		t.Fatalf("after refused cancels: %+v %v, want CREATED", o.Status, err)
	}
	var list workorderv1.ListWorkOrdersResponse
	if err := b.conn.Invoke(b.as(t, ctx, otherCaller), workorderv1.WorkOrderService_ListWorkOrders_FullMethodName,
		&workorderv1.ListWorkOrdersRequest{}, &list); err != nil || len(list.GetWorkOrders()) != 0 {
		t.Fatalf("another caller's listing: %d orders (%v), want none", len(list.GetWorkOrders()), err)
	}

	// The operator lists every order and may cancel.
	if err := b.conn.Invoke(b.as(t, ctx, operatorCaller), workorderv1.WorkOrderService_ListWorkOrders_FullMethodName,
		&workorderv1.ListWorkOrdersRequest{}, &list); err != nil || len(list.GetWorkOrders()) != 1 {
		t.Fatalf("operator's listing: %d orders (%v), want 1", len(list.GetWorkOrders()), err)
	}
	var cancelled workorderv1.CancelWorkOrderResponse
	if err := b.conn.Invoke(b.as(t, ctx, operatorCaller), workorderv1.WorkOrderService_CancelWorkOrder_FullMethodName,
		&workorderv1.CancelWorkOrderRequest{Id: id}, &cancelled); err != nil ||
		cancelled.GetWorkOrder().GetStatus() != workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CANCELLED {
		t.Fatalf("operator's cancel: %v %v", cancelled.GetWorkOrder().GetStatus(), err)
	}
	// The creator still reads its order.
	got, err := b.grpc.GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: id})
	if err != nil || got.GetWorkOrder().GetCreator() != testCaller {
		t.Fatalf("creator's get: %v %v", got.GetWorkOrder().GetCreator(), err)
	}
}

func methodOf(name string) string {
	return map[string]string{
		"get":     workorderv1.WorkOrderService_GetWorkOrder_FullMethodName,
		"history": workorderv1.WorkOrderService_ListWorkOrderHistory_FullMethodName,
		"cancel":  workorderv1.WorkOrderService_CancelWorkOrder_FullMethodName,
	}[name]
}

func requestOf(name, id string) proto.Message {
	switch name {
	case "get":
		return &workorderv1.GetWorkOrderRequest{Id: id}
	case "history":
		return &workorderv1.ListWorkOrderHistoryRequest{Id: id}
	}
	return &workorderv1.CancelWorkOrderRequest{Id: id}
}

func responseOf(name string) proto.Message {
	switch name {
	case "get":
		return &workorderv1.GetWorkOrderResponse{}
	case "history":
		return &workorderv1.ListWorkOrderHistoryResponse{}
	}
	return &workorderv1.CancelWorkOrderResponse{}
}

func countRows(t *testing.T, b testBundle, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
