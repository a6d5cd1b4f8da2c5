package app_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/api"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
)

// The public service's authorization matrix (docs/adr/0025-authorization.md):
// ProviderService is the peer's alone. Clients of the other services, even
// of every customer, are refused: provider-sim has no clients.
var authzMatrix = map[string]map[string]codes.Code{
	"SubmitWorkOrder": {
		"no token": codes.Unauthenticated, "wrong audience": codes.Unauthenticated,
		"unlisted account": codes.PermissionDenied, "client of A for A": codes.PermissionDenied,
		"client of A for B": codes.PermissionDenied, "client * for B": codes.PermissionDenied,
		"peer": codes.OK,
	},
}

// TestAuthorizationMatrix calls every ProviderService method, as its
// descriptor lists them, as every caller kind, against the app with real
// PostgreSQL; a method or caller kind missing from the matrix fails.
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
	b := setupWith(t, time.Hour, operatorToken, func(c *app.Config) {
		c.Auth = libenv.CallerAuth{OIDC: server.OIDCConfig{Issuer: issuer.URL(), Audience: "provider-sim"}}
		c.AllowedCallers = []string{"workorder"}
	})
	kinds := []struct{ name, subject, audience, customer string }{
		{"no token", "", "", "cust-a"},
		{"wrong audience", "workorder", "billing", "cust-a"},
		{"unlisted account", "stranger", "", "cust-a"},
		{"client of A for A", "client-a", "", "cust-a"},
		{"client of A for B", "client-a", "", "cust-b"},
		{"client * for B", "demo", "", "cust-b"},
		{"peer", "workorder", "", "cust-a"},
	}
	sd := providerv1.File_lossless_provider_v1_provider_proto.Services().ByName("ProviderService")
	accepted := 0
	for i := range sd.Methods().Len() {
		name := string(sd.Methods().Get(i).Name())
		full := "/" + string(sd.FullName()) + "/" + name
		row, ok := authzMatrix[name]
		if !ok {
			t.Errorf("%s has no entry in the authorization matrix", full)
			continue
		}
		for _, k := range kinds {
			want, ok := row[k.name]
			if !ok {
				t.Errorf("%s: no expectation for %s", full, k.name)
				continue
			}
			ctx := context.Background()
			if k.subject != "" {
				aud := k.audience
				if aud == "" {
					aud = "provider-sim"
				}
				tok, err := issuer.Mint(localissuer.Claims{Subject: k.subject, Audience: aud})
				if err != nil {
					t.Fatal(err)
				}
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			}
			var req, out proto.Message
			switch name {
			case "SubmitWorkOrder":
				req = &providerv1.SubmitWorkOrderRequest{WorkOrderId: uuid.NewString(), CustomerId: k.customer, Positions: 1}
				out = &providerv1.SubmitWorkOrderResponse{}
			default:
				t.Errorf("%s: the matrix test does not know how to call it", full)
				continue
			}
			err := b.conn.Invoke(ctx, full, req, out)
			if got := status.Code(err); got != want {
				t.Errorf("%s as %s: %v, want %v", full, k.name, err, want)
			}
			if status.Code(err) == codes.PermissionDenied && apierror.Reason(err) != api.ReasonCallerNotAllowed {
				t.Errorf("%s as %s: reason %q, want %s", full, k.name, apierror.Reason(err), api.ReasonCallerNotAllowed)
			}
			if err == nil {
				accepted++
			}
		}
	}
	var jobs int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&jobs); err != nil || jobs != accepted {
		t.Fatalf("jobs = %d (%v), want %d: only the peer's", jobs, err, accepted)
	}
}

// Every method the app serves has a rule: the policy is checked at start
// (an unruled method fails it), and here against the mounted services.
func TestEveryServedMethodHasARule(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Hour)
	policy := api.Policy()
	for name, info := range b.app.GRPCServices() {
		if name == "grpc.health.v1.Health" {
			continue
		}
		for _, m := range info.Methods {
			if _, ok := policy["/"+name+"/"+m.Name]; !ok {
				t.Errorf("/%s/%s has no rule in api.Policy", name, m.Name)
			}
		}
	}
}
