package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

func (r repair) outboxRow(t *testing.T, eventID string) (status string, attempts int, lastError string) {
	t.Helper()
	err := r.pool.QueryRow(context.Background(), `SELECT status, attempts, coalesce(last_error, '') FROM outbox_events WHERE event_id = $1`,
		eventID).Scan(&status, &attempts, &lastError)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempts, lastError
}

// Billing's InvoiceIssued events, as its relay leaves them when Pub/Sub
// refuses two permanently: listed over gRPC by state; the FAILED ones are
// requeued over gRPC and with `billing outbox requeue`. Refused without
// ticket, actor, valid ids or the token (nothing changed, nothing audited);
// a dry run reports the FAILED event, skips the published one and changes
// nothing but the audit log; the requeue makes the event PENDING with a
// fresh budget once; every call is audited as outbox.requeue.
func TestRequeueOutboxEvents_OverGRPCAndCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRepair(t, nil, intake.Config{}, nil)
	orders := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	var eventType string
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		for _, o := range orders {
			ev, err := outbox.NewEvent(ctx, issuer.AggregateType, o, &eventsv1.InvoiceIssued{EventId: uuid.NewString(),
				InvoiceId: uuid.NewString(), WorkOrderId: o, IssuedAt: timestamppb.Now()})
			if err != nil {
				return err
			}
			eventType = ev.Type
			if err := outbox.Append(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]bool{orders[1]: true, orders[2]: true}
	relay, err := outbox.NewRelay(r.pool, map[string]outbox.Dispatcher{
		eventType: outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
			if refused[ev.AggregateID] {
				return nil, retry.Permanent(errors.New("topic refuses the message"))
			}
			return nil, nil
		}),
	}, outbox.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ProcessBatch(ctx); err != nil {
		t.Fatal(err)
	}

	cl, octx := r.operatorService(t, nil)
	list, err := cl.ListOutboxEvents(octx, &opsv1.ListOutboxEventsRequest{States: []string{"FAILED"}})
	if err != nil || len(list.GetEvents()) != 2 || list.GetEvents()[0].GetAggregateId() != orders[1] ||
		list.GetEvents()[0].GetLastError() != "permanent: topic refuses the message" || list.GetEvents()[0].GetAttempts() != 1 {
		t.Fatalf("FAILED events: %v %v", list, err)
	}
	failed, viaCLI := list.GetEvents()[0].GetEventId(), list.GetEvents()[1].GetEventId()
	pub, err := cl.ListOutboxEvents(octx, &opsv1.ListOutboxEventsRequest{States: []string{"PUBLISHED"}, AggregateId: orders[0]})
	if err != nil || len(pub.GetEvents()) != 1 || pub.GetEvents()[0].GetPublishTime() == nil {
		t.Fatalf("published events: %v %v", pub, err)
	}
	published := pub.GetEvents()[0].GetEventId()
	if _, err := cl.ListOutboxEvents(context.Background(), &opsv1.ListOutboxEventsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("list without a token: %v, want UNAUTHENTICATED", err)
	}

	for _, c := range []struct {
		name string
		req  *opsv1.RequeueOutboxEventsRequest
		want string
	}{
		{"no authorization", &opsv1.RequeueOutboxEventsRequest{EventIds: []string{failed}}, "authorization"},
		{"no actor", &opsv1.RequeueOutboxEventsRequest{EventIds: []string{failed},
			Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-9"}}, "authorization.actor"},
		{"no ids", &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz}, "event_ids"},
		{"not a uuid", &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz, EventIds: []string{"42"}}, "event_ids[0]"},
	} {
		_, err := cl.RequeueOutboxEvents(octx, c.req)
		if got := fieldViolations(err); status.Code(err) != codes.InvalidArgument || !slices.Equal(got, []string{c.want}) {
			t.Errorf("%s: %v, violations %v, want [%s]", c.name, err, got, c.want)
		}
	}
	if _, err := cl.RequeueOutboxEvents(context.Background(), &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz,
		EventIds: []string{failed}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("requeue without a token: %v, want UNAUTHENTICATED", err)
	}
	if st, _, _ := r.outboxRow(t, failed); st != "FAILED" || r.count(t, `SELECT count(*) FROM operator_audit`) != 0 {
		t.Fatalf("a refused requeue changed something: %s", st)
	}

	_, _, failedWith := r.outboxRow(t, failed)
	dry, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz,
		EventIds: []string{failed, published}, DryRun: true})
	if err != nil || !dry.GetDryRun() || !slices.Equal(dry.GetEventIds(), []string{failed}) ||
		len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetEventId() != published || dry.GetSkipped()[0].GetState() != "PUBLISHED" {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if st, n, e := r.outboxRow(t, failed); st != "FAILED" || n != 1 || e != failedWith {
		t.Fatalf("the dry run changed the event: %s, %d attempts, %q", st, n, e)
	}
	if _, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz,
		EventIds: []string{failed, published}}); err != nil {
		t.Fatal(err)
	}
	if st, n, e := r.outboxRow(t, failed); st != "PENDING" || n != 0 || e != "requeued by break-glass, ticket INC-9; was: "+failedWith {
		t.Fatalf("requeued event: %s, %d attempts, %q", st, n, e)
	}
	again, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuthz, EventIds: []string{failed}})
	if err != nil || len(again.GetEventIds()) != 0 || again.GetSkipped()[0].GetState() != "PENDING" {
		t.Fatalf("second requeue: %v %v, want nothing requeued", again, err)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND ticket = 'INC-9' AND actor = 'break-glass'`); n != 3 {
		t.Fatalf("audit rows = %d, want 3 (dry run, requeue, second requeue)", n)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND affected = 1 AND dry_run = false
		AND params->'requeued' = to_jsonb(ARRAY[$1::text])`, failed); n != 1 {
		t.Fatalf("audit rows of the requeue naming the event = %d, want 1", n)
	}

	// The CLI: refused without a ticket, then a dry run and the requeue.
	if _, err := r.cli(t, "outbox", "requeue", "-actor", "erin", "-ids", viaCLI); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("requeue without a ticket: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := r.cli(t, "outbox", "requeue", "-ticket", "INC-10", "-actor", "erin", "-ids", "nope"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("requeue of a malformed id: %v, want INVALID_ARGUMENT", err)
	}
	out, err := r.cli(t, "outbox", "requeue", "-ticket", "INC-10", "-actor", "erin", "-ids", viaCLI+","+published, "-dry-run")
	if err != nil || !strings.Contains(out, "dry run: would requeue 1 FAILED outbox events: ["+viaCLI+"]") ||
		!strings.Contains(out, "not requeued: "+published+" (PUBLISHED)") {
		t.Fatalf("CLI dry run: %q %v", out, err)
	}
	if st, _, _ := r.outboxRow(t, viaCLI); st != "FAILED" {
		t.Fatalf("the CLI dry run changed the event: %s", st)
	}
	if out, err := r.cli(t, "outbox", "requeue", "-ticket", "INC-10", "-actor", "erin", "-ids", viaCLI); err != nil ||
		!strings.Contains(out, "requeued 1 FAILED outbox events: ["+viaCLI+"]") {
		t.Fatalf("CLI requeue: %q %v", out, err)
	}
	if st, n, e := r.outboxRow(t, viaCLI); st != "PENDING" || n != 0 || !strings.HasPrefix(e, "requeued by erin, ticket INC-10; was: ") {
		t.Fatalf("event requeued by the CLI: %s, %d attempts, %q", st, n, e)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND ticket = 'INC-10' AND actor = 'erin'`); n != 2 {
		t.Fatalf("CLI audit rows = %d, want 2 (dry run and requeue)", n)
	}
}
