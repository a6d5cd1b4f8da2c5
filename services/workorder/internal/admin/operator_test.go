package admin_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc"

	pkgoperator "github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// opsAuth authorizes the OperatorService repairs of these tests.
var opsAuth = &opsv1.OperatorAuthorization{Ticket: "INC-12", Actor: "dana"}

// servedOps serves the work-order database's OperatorService
// (pkg/operator over admin.OperatorDeps) as the app mounts it: the outbox,
// operator_audit, the inbox and the InvoiceIssued consumer (invoicing,
// b's) with its parked messages and, with ps, the dead letters of both
// consumers. It returns a client.
func servedOps(t *testing.T, b bundle, ps *gpubsub.Client) opsv1.OperatorServiceClient {
	t.Helper()
	return servedOpsWithToken(t, b, ps, token)
}

// servedOpsWithToken is servedOps with the operator token tok (empty:
// every call refused).
func servedOpsWithToken(t *testing.T, b bundle, ps *gpubsub.Client, tok string) opsv1.OperatorServiceClient {
	t.Helper()
	deps, err := admin.OperatorDeps(b.pool, b.inv, receiver.Config{}, ps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	deps.Token = tok
	svc, err := pkgoperator.NewService(deps)
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, svc.AuthInterceptor(), func(s *grpc.Server) { opsv1.RegisterOperatorServiceServer(s, svc) })
	return opsv1.NewOperatorServiceClient(conn)
}

// inProcessOps are the same operations as the CLI runs them (no token),
// with b's Pub/Sub client.
func inProcessOps(t *testing.T, b bundle) pkgoperator.Operations {
	t.Helper()
	deps, err := admin.OperatorDeps(b.pool, b.inv, receiver.Config{}, b.ps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := pkgoperator.NewInProcess(deps)
	if err != nil {
		t.Fatal(err)
	}
	return loggedIn(t, ops, nil, "alice")
}

// loggedIn is ops run by the operator the command names with --actor (the
// test stands in for the command line's login, operator.ActingAs), or by
// def.
func loggedIn(t *testing.T, ops pkgoperator.Operations, args []string, def string) pkgoperator.Operations {
	t.Helper()
	as := def
	for i, a := range args {
		if (a == "--actor" || a == "-actor") && i+1 < len(args) && args[i+1] != "" {
			as = args[i+1]
		}
	}
	ops, err := pkgoperator.ActingAs(ops, as)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// cli runs `workorder <args>`, one of the operator commands, as main does.
func (b bundle) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := pkgoperator.RunCLI(context.Background(), args, loggedIn(t, inProcessOps(t, b), args, "alice"), admin.ConsumerInvoicing, &out)
	return out.String(), err
}
