package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
)

// The matrix's callers and customers: AUTH_CLIENTS
// client-a=cust-a,client-all=*.
const (
	clientOfA   = "client-a"
	clientOfAll = "client-all"
	customerA   = "cust-a"
	customerB   = "cust-b"
	audience    = "billing"
)

type callerKind struct {
	name, subject, audience, customer string
}

var callerKinds = []callerKind{
	{name: "no token", customer: customerA},
	{name: "wrong audience", subject: clientOfA, audience: "workorder", customer: customerA},
	{name: "unlisted account", subject: "stranger", customer: customerA},
	{name: "peer", subject: "workorder", customer: customerA},
	{name: "client of A for A", subject: clientOfA, customer: customerA},
	{name: "client of A for B", subject: clientOfA, customer: customerB},
	{name: "client * for B", subject: clientOfAll, customer: customerB},
}

// authzMatrix is the expected code of every BillingService method for the
// clients (the others are refused alike on every method: see expected).
var authzMatrix = map[string]map[string]codes.Code{
	"GetInvoice":   {"client of A for A": codes.OK, "client of A for B": codes.NotFound, "client * for B": codes.OK},
	"ListInvoices": {"client of A for A": codes.OK, "client of A for B": codes.OK, "client * for B": codes.OK},
}

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

// TestAuthorizationMatrix calls every BillingService method, as its
// descriptor lists them, as every caller kind, with real PostgreSQL and
// verified tokens; a method missing from the matrix fails.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	issuerSrv := httptest.NewUnstartedServer(nil)
	issuer, err := localissuer.New("http://"+issuerSrv.Listener.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	issuerSrv.Config.Handler = issuer.Handler()
	issuerSrv.Start()
	t.Cleanup(issuerSrv.Close)
	verifier, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: issuer.URL(), Audience: audience}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := setupAuth(t, pgtest.NewPool(t, migrations.Billing()...), verifier,
		authz.Clients{clientOfA: authz.Only(customerA), clientOfAll: authz.All()})
	now := time.Now().Add(-time.Minute)
	invoices := map[string]string{
		customerA: b.issueFor(t, customerA, now).ID.String(),
		customerB: b.issueFor(t, customerB, now).ID.String(),
	}

	sd := billingv1.File_lossless_billing_v1_billing_proto.Services().ByName("BillingService")
	if sd.Methods().Len() < 2 {
		t.Fatalf("found %d methods, want the service's 2 or more", sd.Methods().Len())
	}
	for i := range sd.Methods().Len() {
		m := sd.Methods().Get(i)
		name := string(m.Name())
		full := "/" + string(sd.FullName()) + "/" + name
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
					aud = audience
				}
				tok, err := issuer.Mint(localissuer.Claims{Subject: k.subject, Audience: aud})
				if err != nil {
					t.Fatal(err)
				}
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			}
			var req, out proto.Message
			switch name {
			case "GetInvoice":
				req, out = &billingv1.GetInvoiceRequest{Id: invoices[k.customer]}, &billingv1.GetInvoiceResponse{}
			case "ListInvoices":
				req, out = &billingv1.ListInvoicesRequest{}, &billingv1.ListInvoicesResponse{}
			default:
				t.Errorf("%s: the matrix test does not know how to call it", full)
				continue
			}
			err := b.conn.Invoke(ctx, full, req, out)
			if got := status.Code(err); got != want {
				t.Errorf("%s as %s: %v, want %v", full, k.name, err, want)
				continue
			}
			// The effect: a client lists its customers' invoices only, and
			// a client of every customer lists them all.
			if l, ok := out.(*billingv1.ListInvoicesResponse); ok && err == nil {
				wantN := map[string]int{clientOfA: 1, clientOfAll: 2}[k.subject]
				if len(l.GetInvoices()) != wantN {
					t.Errorf("%s as %s: %d invoices, want %d", full, k.name, len(l.GetInvoices()), wantN)
				}
				for _, inv := range l.GetInvoices() {
					if k.subject == clientOfA && inv.GetCustomerId() != customerA {
						t.Errorf("%s as %s lists customer %s's invoice", full, k.name, inv.GetCustomerId())
					}
				}
			}
		}
	}

	// Through the gateway: another customer's invoice is a 404 like an
	// unknown one, and a page of one is the caller's newest invoice with
	// no invisible invoice behind it.
	tok, err := issuer.Mint(localissuer.Claims{Subject: clientOfA, Audience: audience})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) int {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, b.base+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/v1/invoices/" + invoices[customerB]); code != http.StatusNotFound {
		t.Fatalf("REST another customer's invoice: HTTP %d, want 404", code)
	}
	b.issueFor(t, customerB, now.Add(time.Second)) // newer than client-a's
	var page billingv1.ListInvoicesResponse
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	if err := b.conn.Invoke(ctx, billingv1.BillingService_ListInvoices_FullMethodName, &billingv1.ListInvoicesRequest{PageSize: 1}, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.GetInvoices()) != 1 || page.GetInvoices()[0].GetId() != invoices[customerA] || page.GetNextPageToken() != "" {
		t.Fatalf("client-a's page of 1: %v next %q, want its invoice alone", page.GetInvoices(), page.GetNextPageToken())
	}
}
