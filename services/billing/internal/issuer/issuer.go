// Package issuer is the invoice job's handler: it turns one completed work
// order into exactly one invoice and one InvoiceIssued event. The work runs
// under the job's lease; the writes run in the job's fenced completion
// (pkg/leasequeue), so a worker that lost its lease writes nothing.
package issuer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/billing/internal/invoice"
	"github.com/lossless-dev/lossless/services/billing/internal/store"
)

// AggregateType of billing's outbox events.
const AggregateType = "invoice"

// Issuer handles invoice jobs.
type Issuer struct {
	now       func() time.Time
	logger    *slog.Logger
	issued    metric.Int64Counter
	preexists metric.Int64Counter
	hops      *orderhop.Recorder
}

// New returns an issuer. now is the clock of issue times (the queue's clock
// in tests); nil means time.Now. meter may be nil.
func New(now func() time.Time, logger *slog.Logger, meter metric.Meter) (*Issuer, error) {
	if logger == nil {
		return nil, errors.New("issuer: nil logger")
	}
	if now == nil {
		now = time.Now
	}
	meter = telemetry.MeterOrNoop(meter)
	issued, err := meter.Int64Counter("billing.invoices.issued", metric.WithDescription("Invoices issued."))
	if err != nil {
		return nil, err
	}
	preexists, err := meter.Int64Counter("billing.invoices.already_issued",
		metric.WithDescription("Invoice jobs that found their order already invoiced (the unique constraint held; investigate how a second job arose)."))
	if err != nil {
		return nil, err
	}
	hops, err := orderhop.New(meter)
	if err != nil {
		return nil, err
	}
	return &Issuer{now: now, logger: logger, issued: issued, preexists: preexists, hops: hops}, nil
}

// Handle is the leasequeue.Handler of invoice jobs. The payload is the
// WorkOrderCompletionRecorded event, validated at intake. Anything that makes
// the invoice impossible (undecodable payload, invalid amounts, overflow) is
// permanent: the job is parked for an operator, never retried in a loop.
func (i *Issuer) Handle(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
	var ev eventsv1.WorkOrderCompletionRecorded
	if err := proto.Unmarshal(job.Payload, &ev); err != nil {
		return nil, retry.Permanent(fmt.Errorf("decode job payload: %w", err))
	}
	order, err := OrderFromEvent(&ev)
	if err != nil {
		return nil, retry.Permanent(err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	inv, err := invoice.Compute(id, order, i.now())
	if err != nil {
		return nil, retry.Permanent(err)
	}
	issued := &eventsv1.InvoiceIssued{
		InvoiceId:   inv.ID.String(),
		WorkOrderId: inv.WorkOrderID.String(),
		Total:       &moneyv1.Money{CurrencyCode: inv.Currency, MinorUnits: inv.TotalMinor},
		IssuedAt:    timestamppb.New(inv.IssuedAt),
	}
	// The effects commit later, in a group commit outside this attempt's
	// span. Under its span context again, InvoiceIssued's outbox headers
	// (outbox.NewEvent) name the attempt as its producer (docs/adr/0009),
	// and the log lines carry its ids.
	sc := trace.SpanContextFromContext(ctx)
	return func(ctx context.Context, tx pgx.Tx) error {
		if sc.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, sc)
		}
		number, inserted, err := store.InsertInvoice(ctx, tx, inv, job.ID, ev.GetEventId())
		if err != nil {
			return err
		}
		if !inserted {
			// The order already has its invoice (and its InvoiceIssued was
			// appended with it): finish the job without a second event.
			i.preexists.Add(ctx, 1)
			i.logger.WarnContext(ctx, "work order already invoiced; job finished without a second invoice",
				"job_id", job.ID, "work_order_id", inv.WorkOrderID)
			return nil
		}
		msg := proto.CloneOf(issued)
		msg.InvoiceNumber = number
		oev, err := outbox.NewEvent(ctx, AggregateType, inv.WorkOrderID.String(), msg)
		if err != nil {
			return err
		}
		// The message's own event_id is the outbox row's id: one identity for
		// the business fact, stable across re-publishing.
		msg.EventId = oev.ID.String()
		if oev.Payload, err = proto.Marshal(msg); err != nil {
			return err
		}
		oev.OccurredAt = inv.IssuedAt
		if err := outbox.Append(ctx, tx, oev); err != nil {
			return err
		}
		i.issued.Add(ctx, 1)
		i.hops.Observe(ctx, orderhop.InvoiceIssue, job.CreatedAt, inv.IssuedAt)
		i.logger.DebugContext(ctx, "invoice issued", "invoice_id", inv.ID, "number", number,
			"work_order_id", inv.WorkOrderID, "job_id", job.ID, "epoch", job.Epoch)
		return nil
	}, nil
}

// OrderFromEvent converts the completion event into the invoicing input.
func OrderFromEvent(ev *eventsv1.WorkOrderCompletionRecorded) (invoice.Order, error) {
	woID, err := uuid.Parse(ev.GetWorkOrderId())
	if err != nil {
		return invoice.Order{}, fmt.Errorf("%w: work_order_id %q: not a uuid", invoice.ErrInvalid, ev.GetWorkOrderId())
	}
	o := invoice.Order{
		WorkOrderID:    woID,
		CustomerID:     ev.GetCustomerId(),
		Description:    ev.GetDescription(),
		CompletedItems: ev.GetCompletedItems(),
		Currency:       ev.GetUnitPrice().GetCurrencyCode(),
		UnitPriceMinor: ev.GetUnitPrice().GetMinorUnits(),
	}
	return o, o.Validate()
}
