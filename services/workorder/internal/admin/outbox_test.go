package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// outboxRow is an outbox event as the requeue changes it.
func (b bundle) outboxRow(t *testing.T, eventID string) (status string, attempts int, lastError string) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(), `SELECT status, attempts, coalesce(last_error, '') FROM outbox_events WHERE event_id = $1`,
		eventID).Scan(&status, &attempts, &lastError)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempts, lastError
}

// Hand-offs the provider refused permanently are FAILED; the operator
// requeues one over gRPC and another with `workorder outbox requeue`: refused
// without ticket, actor, valid ids or the token (nothing changed, nothing
// audited); a dry run reports the FAILED event, skips the published one and
// changes nothing but the audit log; the requeue makes the event PENDING
// with a fresh budget once, and every call is audited as outbox.requeue.
func TestRequeueOutboxEvents_OverGRPCAndCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	repo, err := orders.NewRepository(b.pool)
	if err != nil {
		t.Fatal(err)
	}
	ids := createOrders(t, b.pool, repo, 3)
	refused := map[string]bool{ids[1]: true, ids[2]: true}
	relay, err := outbox.NewRelay(b.pool, map[string]outbox.Dispatcher{
		handoff.EventType: outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
			if refused[ev.AggregateID] {
				return nil, retry.Permanent(errors.New("provider refused the order"))
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
	cl := servedOps(t, b, nil)
	octx := asOperator()
	eventOf := map[string]string{}
	for _, st := range []string{"FAILED", "PUBLISHED"} {
		resp, err := cl.ListOutboxEvents(octx, &opsv1.ListOutboxEventsRequest{States: []string{st}})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEvents() {
			eventOf[e.GetAggregateId()] = e.GetEventId()
		}
	}
	failed, viaCLI, published := eventOf[ids[1]], eventOf[ids[2]], eventOf[ids[0]]
	if failed == "" || viaCLI == "" || published == "" {
		t.Fatalf("events after the relay: %v", eventOf)
	}

	_, err = cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{EventIds: []string{failed}})
	wantViolation(t, "no authorization", err, "authorization")
	_, err = cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{EventIds: []string{failed},
		Authorization: &opsv1.OperatorAuthorization{Actor: "dana"}})
	wantViolation(t, "no ticket", err, "authorization.ticket")
	_, err = cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth})
	wantViolation(t, "no ids", err, "event_ids")
	_, err = cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth, EventIds: []string{"42"}})
	wantViolation(t, "not a uuid", err, "event_ids[0]")
	if _, err := cl.RequeueOutboxEvents(context.Background(), &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth,
		EventIds: []string{failed}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("requeue without a token: %v, want UNAUTHENTICATED", err)
	}
	if st, _, _ := b.outboxRow(t, failed); st != "FAILED" || b.count(t, `SELECT count(*) FROM operator_audit`) != 0 {
		t.Fatalf("a refused requeue changed something: %s", st)
	}

	_, _, failedWith := b.outboxRow(t, failed)
	dry, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth,
		EventIds: []string{failed, published}, DryRun: true})
	if err != nil || !dry.GetDryRun() || len(dry.GetEventIds()) != 1 || dry.GetEventIds()[0] != failed ||
		len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetEventId() != published || dry.GetSkipped()[0].GetState() != "PUBLISHED" {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if st, n, e := b.outboxRow(t, failed); st != "FAILED" || n != 1 || e != failedWith {
		t.Fatalf("the dry run changed the event: %s, %d attempts, %q", st, n, e)
	}
	if _, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth,
		EventIds: []string{failed, published}}); err != nil {
		t.Fatal(err)
	}
	if st, n, e := b.outboxRow(t, failed); st != "PENDING" || n != 0 || e != "requeued by break-glass, ticket INC-12; was: "+failedWith {
		t.Fatalf("requeued event: %s, %d attempts, %q", st, n, e)
	}
	again, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{Authorization: opsAuth, EventIds: []string{failed}})
	if err != nil || len(again.GetEventIds()) != 0 || again.GetSkipped()[0].GetState() != "PENDING" {
		t.Fatalf("second requeue: %v %v, want nothing requeued", again, err)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND ticket = 'INC-12' AND actor = 'break-glass'`); n != 3 {
		t.Fatalf("audit rows = %d, want 3 (dry run, requeue, second requeue)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND affected = 1 AND dry_run = false
		AND params->'requeued' = to_jsonb(ARRAY[$1::text])`, failed); n != 1 {
		t.Fatalf("audit rows of the requeue naming the event = %d, want 1", n)
	}

	// The CLI: refused without a ticket, then a dry run and the requeue.
	run := func(args ...string) (string, error) { return b.cli(t, append([]string{"outbox"}, args...)...) }
	if _, err := run("requeue", "--actor", "erin", "--ids", viaCLI); err == nil {
		t.Fatal("requeue without a ticket accepted")
	}
	if _, err := run("requeue", "--ticket", "INC-13", "--actor", "erin", "--ids", "nope"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("requeue of a malformed id: %v, want INVALID_ARGUMENT", err)
	}
	out, err := run("requeue", "--ticket", "INC-13", "--actor", "erin", "--ids", viaCLI+","+published, "--dry-run")
	if err != nil || !strings.Contains(out, "dry run: would requeue 1 FAILED outbox events: ["+viaCLI+"]") ||
		!strings.Contains(out, "not requeued: "+published+" (PUBLISHED)") {
		t.Fatalf("CLI dry run: %q %v", out, err)
	}
	if st, _, _ := b.outboxRow(t, viaCLI); st != "FAILED" {
		t.Fatalf("the CLI dry run changed the event: %s", st)
	}
	if out, err := run("requeue", "--ticket", "INC-13", "--actor", "erin", "--ids", viaCLI); err != nil || !strings.Contains(out, "requeued 1 FAILED outbox events") {
		t.Fatalf("CLI requeue: %q %v", out, err)
	}
	if st, n, e := b.outboxRow(t, viaCLI); st != "PENDING" || n != 0 || !strings.HasPrefix(e, "requeued by erin, ticket INC-13; was: ") {
		t.Fatalf("event requeued by the CLI: %s, %d attempts, %q", st, n, e)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND ticket = 'INC-13' AND actor = 'erin'`); n != 2 {
		t.Fatalf("CLI audit rows = %d, want 2 (dry run and requeue)", n)
	}
}
