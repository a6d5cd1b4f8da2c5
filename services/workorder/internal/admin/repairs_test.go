package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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

func invoiceIssued(order uuid.UUID) *eventsv1.InvoiceIssued {
	return &eventsv1.InvoiceIssued{EventId: uuid.NewString(), InvoiceId: uuid.NewString(), InvoiceNumber: "INV-2026-000007",
		WorkOrderId: order.String(), Total: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 3750}, IssuedAt: timestamppb.Now()}
}

func (b bundle) completedOrder(t *testing.T, id uuid.UUID) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO work_orders
		(id, customer_id, description, positions, currency_code, unit_price_minor, status, completed_items, version)
		VALUES ($1, 'cust-1', 'paint', 3, 'EUR', 1250, 'COMPLETED', 3, 3)`, id); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) orderStatus(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(context.Background(), `SELECT status FROM work_orders WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A parked InvoiceIssued (its order unknown when it arrived) is listed and,
// once the order exists, replayed over gRPC through the consumer's path: a
// dry run reports the outcome and changes nothing but the audit log, the
// replay invoices the order once, a second replay finds the row closed;
// refused while the cause persists, without authorization or without the
// token.
func TestReplayParkedBillingEvent_OverGRPC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	order := uuid.New()
	ev := invoiceIssued(order)
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	m := &pubsub.Received{ID: "m-1", Data: data, Attributes: pubsub.EventAttributes(ev.GetEventId(), invoicing.EventType, 1, time.Now())}
	if err := b.inv.Handle(ctx, m); err != nil {
		t.Fatal(err)
	}
	cl := servedOps(t, b, nil)
	octx := asOperator()

	list, err := cl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{})
	if err != nil || len(list.GetMessages()) != 1 || list.GetMessages()[0].GetSubject() != order.String() ||
		list.GetMessages()[0].GetReason() != "unknown work order "+order.String() || list.GetMessages()[0].GetSubscription() != topology.SubBillingEvents {
		t.Fatalf("parked billing events: %v %v", list, err)
	}
	id := list.GetMessages()[0].GetId()
	_, err = cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id})
	wantViolation(t, "no authorization", err, "authorization")
	_, err = cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id,
		Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-12"}})
	wantViolation(t, "no actor", err, "authorization.actor")
	if _, err := cl.ReplayParkedMessage(context.Background(), &opsv1.ReplayParkedMessageRequest{Id: id, Authorization: opsAuth}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("replay without a token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id, Authorization: opsAuth}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("replay while the order is unknown: %v, want FAILED_PRECONDITION", err)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit`) + b.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NOT NULL`); n != 0 {
		t.Fatal("a refused replay changed something")
	}

	b.completedOrder(t, order) // the cause fixed
	dry, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id, Authorization: opsAuth, DryRun: true})
	if err != nil || dry.GetOutcome() != invoicing.OutcomeInvoiced || !dry.GetDryRun() {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if s := b.orderStatus(t, order); s != "COMPLETED" || b.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NULL`) != 1 {
		t.Fatalf("the dry run changed something: order %s", s)
	}
	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id, Authorization: opsAuth}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: id, Authorization: opsAuth}); status.Code(err) != codes.NotFound {
		t.Fatalf("second replay: %v, want NOT_FOUND", err)
	}
	if s := b.orderStatus(t, order); s != "INVOICED" {
		t.Fatalf("order %s after the replay, want INVOICED", s)
	}
	if n := b.count(t, `SELECT count(*) FROM work_order_transitions WHERE work_order_id = $1 AND to_status = 'INVOICED'`, order); n != 1 {
		t.Fatalf("%d INVOICED transitions, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'invoicing.replay-parked' AND ticket = 'INC-12' AND actor = 'break-glass' AND params->>'stated_actor' = 'dana'`); n != 2 {
		t.Fatalf("audit rows = %d, want 2 (dry run and replay)", n)
	}
	if left, err := cl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{}); err != nil || len(left.GetMessages()) != 0 {
		t.Fatalf("replayed event still listed: %v %v", left, err)
	}
}

// An InvoiceIssued dead letter is applied over gRPC through the consumer:
// the dry run sees it and changes nothing, the replay invoices the order
// once, both are audited.
func TestReplayInvoicingDeadLetters_OverGRPC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	b := setup(t, emu.Client)
	order := uuid.New()
	b.completedOrder(t, order)
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicBillingEventsDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	ev := invoiceIssued(order)
	if _, err := pub.Publish(ctx, pubsub.Message{EventID: ev.GetEventId(), Event: ev}); err != nil {
		t.Fatal(err)
	}
	cl := servedOps(t, b, emu.Client)
	octx := asOperator()
	_, err = cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Consumer: admin.ConsumerInvoicing, MaxMessages: 5,
		Authorization: &opsv1.OperatorAuthorization{Actor: "dana"}})
	wantViolation(t, "no ticket", err, "authorization.ticket")
	if _, err := cl.ReplayDeadLetters(context.Background(), &opsv1.ReplayDeadLettersRequest{
		MaxMessages: 5, Authorization: opsAuth}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("replay without a token: %v, want UNAUTHENTICATED", err)
	}
	var seen []string
	waitfor.Condition(t, 30*time.Second, "the dry run sees the dead letter", func() bool {
		res, err := cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Consumer: admin.ConsumerInvoicing, MaxMessages: 5, Authorization: opsAuth, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		seen = res.GetMessageIds()
		return len(seen) == 1
	})
	if s := b.orderStatus(t, order); s != "COMPLETED" {
		t.Fatalf("order %s after the dry run, want COMPLETED", s)
	}
	waitfor.Condition(t, 30*time.Second, "the dead letter is applied", func() bool {
		res, err := cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Consumer: admin.ConsumerInvoicing, MaxMessages: 5,
			Authorization: opsAuth, MessageIds: seen})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetOutcomes()[invoicing.OutcomeInvoiced] == 1
	})
	if s := b.orderStatus(t, order); s != "INVOICED" {
		t.Fatalf("order %s after the replay, want INVOICED", s)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'invoicing.replay-dead-letters' AND ticket = 'INC-12' AND affected = 1`); n < 2 {
		t.Fatalf("audit rows with an effect = %d, want the dry run and the replay", n)
	}
}
