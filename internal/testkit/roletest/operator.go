package roletest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// OperatorServiceIsMounted checks what every service that mounts
// OperatorService (pkg/operator) over its own database owes, on the gRPC
// listener at grpcAddr: a call without the token is refused
// (UNAUTHENTICATED), and with it a requeue dry run is answered and lands in
// the service's operator_audit, which the same API lists. dial are the
// transport options (e.g. a server.TLS's DialOption for a listener serving
// TLS); default plaintext.
func OperatorServiceIsMounted(t *testing.T, grpcAddr, token string, dial ...grpc.DialOption) {
	t.Helper()
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(grpcAddr, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ops := opsv1.NewOperatorServiceClient(conn)
	waitfor.Condition(t, 10*time.Second, "OperatorService answers", func() bool {
		_, err := ops.ListOperatorAudit(context.Background(), &opsv1.ListOperatorAuditRequest{})
		return status.Code(err) != codes.Unavailable
	})
	if _, err := ops.ListOutboxEvents(context.Background(), &opsv1.ListOutboxEventsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListOutboxEvents without the token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := ops.ListParkedMessages(context.Background(), &opsv1.ListParkedMessagesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListParkedMessages without the token: %v, want UNAUTHENTICATED", err)
	}
	authed := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
	ticket := "INC-" + uuid.NewString()[:8]
	dry, err := ops.RequeueOutboxEvents(authed, &opsv1.RequeueOutboxEventsRequest{EventIds: []string{uuid.NewString()}, DryRun: true,
		Authorization: &opsv1.OperatorAuthorization{Ticket: ticket, Actor: "hal"}})
	if err != nil || len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetState() != "" {
		t.Fatalf("requeue dry run of an unknown event: %v %v", dry, err)
	}
	audit, err := ops.ListOperatorAudit(authed, &opsv1.ListOperatorAuditRequest{Ticket: ticket})
	if err != nil || len(audit.GetRecords()) != 1 || audit.GetRecords()[0].GetAction() != "outbox.requeue" || !audit.GetRecords()[0].GetDryRun() {
		t.Fatalf("audit of the dry run: %v %v", audit, err)
	}
}
