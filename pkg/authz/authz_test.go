package authz_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/server"
)

func TestParseClients(t *testing.T) {
	t.Parallel()
	cs, err := authz.ParseClients(" a = c1|c2 , b=*,")
	if err != nil {
		t.Fatal(err)
	}
	if got := cs.String(); got != "a=c1|c2,b=*" {
		t.Fatalf("parsed %q", got)
	}
	for _, bad := range []string{"=c1", "a=", "a= | ", "a=c1,a=c2", "a=*|c1", "a"} {
		if _, err := authz.ParseClients(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCustomers(t *testing.T) {
	t.Parallel()
	some := authz.Only("b", "a", "a")
	if !some.Has("a") || some.Has("c") || some.Has("") || some.All() || strings.Join(some.IDs(), ",") != "a,b" {
		t.Fatalf("Only: %v", some)
	}
	if all := authz.All(); !all.Has("anything") || all.IDs() != nil {
		t.Fatalf("All: %v", all)
	}
	var none authz.Customers
	if none.Has("a") || none.IDs() != nil {
		t.Fatalf("zero: %v", none)
	}
	// A caller listed by subject and email acts for both entries' customers.
	cs := authz.Clients{"123": authz.Only("a"), "svc@x": authz.Only("b")}
	got, ok := cs.Lookup(server.Caller{Subject: "123", Email: "svc@x"})
	if !ok || !got.Has("a") || !got.Has("b") {
		t.Fatalf("lookup: %v %v", got, ok)
	}
	if _, ok := cs.Lookup(server.Caller{Subject: "456"}); ok {
		t.Fatal("unlisted caller found")
	}
	if w := cs.With(authz.All(), "123"); !w["123"].All() || cs["123"].All() {
		t.Fatal("With changed the original or did not widen")
	}
}

const (
	mOpen     = "/test.Svc/Health"
	mClient   = "/test.Svc/Create"
	mPeer     = "/test.Svc/Submit"
	mOperator = "/test.Admin/Retry"
	mNoRule   = "/test.Svc/Added"
)

func newAuthorizer(t *testing.T, log *bytes.Buffer) *authz.Authorizer {
	t.Helper()
	az, err := authz.New(authz.Policy{mOpen: authz.Open, mClient: authz.Client, mPeer: authz.Peer, mOperator: authz.Operator},
		authz.Config{Clients: authz.Clients{"shop": authz.Only("c1")}, Peers: []string{"workorder"}, PeersVar: "PEERS"},
		slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return az
}

// Every rule against every caller, through the unary and the stream
// interceptor alike; a method without a rule is refused and logged.
func TestAuthorizerRules(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	az := newAuthorizer(t, &log)
	unary, stream := az.Unary(), az.Stream()
	as := func(subject string) context.Context {
		if subject == "" {
			return context.Background()
		}
		return server.ContextWithCaller(context.Background(), server.Caller{Subject: subject})
	}
	for _, c := range []struct {
		method, caller string
		want           codes.Code
		kind           authz.Kind
	}{
		{mOpen, "", codes.OK, 0},
		{mOperator, "", codes.OK, 0},
		{mClient, "", codes.Unauthenticated, 0},
		{mClient, "shop", codes.OK, authz.KindClient},
		{mClient, "workorder", codes.PermissionDenied, 0},
		{mPeer, "workorder", codes.OK, authz.KindPeer},
		{mPeer, "shop", codes.PermissionDenied, 0},
		{mNoRule, "shop", codes.PermissionDenied, 0},
	} {
		var seen authz.Principal
		_, err := unary(as(c.caller), nil, &grpc.UnaryServerInfo{FullMethod: c.method}, func(ctx context.Context, _ any) (any, error) {
			seen, _ = authz.FromContext(ctx)
			return nil, nil
		})
		if status.Code(err) != c.want || seen.Kind != c.kind {
			t.Errorf("unary %s as %q: %v kind %v, want %v kind %v", c.method, c.caller, err, seen.Kind, c.want, c.kind)
		}
		seen = authz.Principal{}
		err = stream(nil, fakeStream{ctx: as(c.caller)}, &grpc.StreamServerInfo{FullMethod: c.method}, func(_ any, ss grpc.ServerStream) error {
			seen, _ = authz.FromContext(ss.Context())
			return nil
		})
		if status.Code(err) != c.want || seen.Kind != c.kind {
			t.Errorf("stream %s as %q: %v kind %v, want %v kind %v", c.method, c.caller, err, seen.Kind, c.want, c.kind)
		}
		if c.method == mNoRule && apierror.Reason(err) != authz.ReasonNoRule {
			t.Errorf("no rule: reason %q", apierror.Reason(err))
		}
	}
	if !strings.Contains(log.String(), mNoRule) {
		t.Fatalf("the refusal for want of a rule was not logged: %s", log.String())
	}
}

func TestMayActFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if authz.MayActFor(ctx, "c1") {
		t.Fatal("no principal may act")
	}
	client := authz.ContextWithPrincipal(ctx, authz.Principal{Kind: authz.KindClient, Customers: authz.Only("c1")})
	if !authz.MayActFor(client, "c1") || authz.MayActFor(client, "c2") {
		t.Fatal("client of c1")
	}
	peer := authz.ContextWithPrincipal(ctx, authz.Principal{Kind: authz.KindPeer, Customers: authz.All()})
	if authz.MayActFor(peer, "c1") || authz.CustomersOf(peer).Has("c1") {
		t.Fatal("a peer acts for no customer of its own")
	}
}

func TestRefuseCustomerNamesTheField(t *testing.T) {
	t.Parallel()
	err := authz.RefuseCustomer("work_order.customer_id", "c2")
	st := status.Convert(err)
	if st.Code() != codes.PermissionDenied || apierror.Reason(err) != authz.ReasonCustomerNotAllowed ||
		!strings.Contains(st.Message(), "work_order.customer_id") {
		t.Fatalf("%v", err)
	}
}

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s fakeStream) Context() context.Context { return s.ctx }
