package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// Dead letters of workorder.billing-events are applied through the
// invoicing consumer: the order is invoiced once however often its
// InvoiceIssued is replayed, a dry run changes nothing and leaves the
// messages on the subscription, an InvoiceIssued for an unknown order and a
// payload that does not parse end parked with their reasons, and every run
// is audited in operator_audit.
func TestReplayInvoicingDeadLetters_InvoicesOnceParksTheRest(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	b := setup(t, emu.Client)
	ctx := context.Background()
	order := uuid.New()
	if _, err := b.pool.Exec(ctx, `INSERT INTO work_orders
		(id, customer_id, description, positions, currency_code, unit_price_minor, status, completed_items, version)
		VALUES ($1, 'cust-1', 'paint', 3, 'EUR', 1250, 'COMPLETED', 3, 3)`, order); err != nil {
		t.Fatal(err)
	}
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicBillingEventsDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	issued := func(orderID string) *eventsv1.InvoiceIssued {
		return &eventsv1.InvoiceIssued{EventId: uuid.NewString(), InvoiceId: uuid.NewString(), InvoiceNumber: "INV-2026-000042",
			WorkOrderId: orderID, Total: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 3750}, IssuedAt: timestamppb.Now()}
	}
	ev, unknown := issued(order.String()), issued(uuid.NewString())
	for _, e := range []*eventsv1.InvoiceIssued{ev, ev, unknown} { // ev twice: a duplicate
		if _, err := pub.Publish(ctx, pubsub.Message{EventID: e.GetEventId(), Event: e}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.PublishRaw(ctx, []byte("\xff not a proto"), pubsub.EventAttributes("e-poison", invoicing.EventType, 1, time.Now()), ""); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, error) {
		return b.cli(t, append([]string{"dead-letters", "replay"}, args...)...)
	}
	if _, err := cli("--max", "10"); err == nil {
		t.Fatal("replay without ticket and actor must be refused")
	}
	if _, err := cli("--ticket", "INC-4", "--actor", "alice"); err == nil {
		t.Fatal("replay without --max must be refused")
	}
	out, err := cli("--ticket", "INC-4", "--actor", "alice", "--max", "10", "--dry-run")
	if err != nil || !strings.HasPrefix(out, "dry run: would replay ") || strings.HasPrefix(out, "dry run: would replay 0 ") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	status := func() (s string, version int) {
		if err := b.pool.QueryRow(ctx, `SELECT status, version FROM work_orders WHERE id = $1`, order).Scan(&s, &version); err != nil {
			t.Fatal(err)
		}
		return s, version
	}
	if s, _ := status(); s != "COMPLETED" || b.count(t, `SELECT count(*) FROM parked_messages`)+b.count(t, `SELECT count(*) FROM processed_events`) != 0 {
		t.Fatalf("the dry run changed something: order %s", s)
	}

	outcomes := map[string]int{}
	taken := 0
	ops := inProcessOps(t, b)
	waitfor.Condition(t, 30*time.Second, "all four dead letters replayed", func() bool {
		res, err := ops.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Consumer: admin.ConsumerInvoicing, Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-4", Actor: "alice"},
			MaxMessages: 10})
		if err != nil || len(res.GetFailedMessageIds()) > 0 {
			t.Fatal(res, err)
		}
		taken += len(res.GetMessageIds())
		for o, n := range res.GetOutcomes() {
			outcomes[o] += int(n)
		}
		return taken == 4 // the dry run released all of them
	})
	if outcomes[invoicing.OutcomeInvoiced] != 1 || outcomes[invoicing.OutcomeDuplicate] != 1 || outcomes[invoicing.OutcomeParked] != 2 {
		t.Fatalf("outcomes %v; want invoiced 1, duplicate 1, parked 2", outcomes)
	}
	if s, v := status(); s != "INVOICED" || v != 4 {
		t.Fatalf("order %s version %d; want INVOICED at version 4 (one transition)", s, v)
	}
	if n := b.count(t, `SELECT count(*) FROM work_order_transitions WHERE work_order_id = $1 AND to_status = 'INVOICED'`, order); n != 1 {
		t.Fatalf("%d INVOICED transitions, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM parked_messages WHERE subscription = $1 AND replayed_at IS NULL
		AND (reason LIKE 'unknown work order %' OR event_id IS NULL)`, topology.SubBillingEvents); n != 2 {
		t.Fatalf("parked with their reasons: %d, want 2", n)
	}

	// Everything was acked: another run finds nothing and changes nothing.
	out, err = cli("--ticket", "INC-4", "--actor", "alice", "--max", "10")
	if err != nil || out != "replayed 0 dead letters [] (failed 0)\n" {
		t.Fatalf("second run: %q %v", out, err)
	}
	if _, v := status(); v != 4 || b.count(t, `SELECT count(*) FROM parked_messages`) != 2 {
		t.Fatal("the second run changed something")
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'invoicing.replay-dead-letters' AND ticket = 'INC-4' AND actor = 'alice' AND dry_run`); n != 1 {
		t.Fatalf("dry run audit rows = %d, want 1", n)
	}
	if n := b.count(t, `SELECT coalesce(sum(affected), 0) FROM operator_audit WHERE action = 'invoicing.replay-dead-letters' AND NOT dry_run`); n != 4 {
		t.Fatalf("audited replayed dead letters = %d, want 4", n)
	}
}
