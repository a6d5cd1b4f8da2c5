// Package correlation applies the provider's events, stored in the inbox, to
// work orders: the inbox.Handler of the work-order service. Each call runs in
// the relay's transaction, so the order's change, its history row, its
// outbox event and the inbox entry's status commit together or not at all.
//
// A claimed batch is applied set-based (inbox.BatchHandler), in a fixed
// number of statements however many entries it holds:
//
//  1. read: lock the batch's orders with their open waiting points
//     (orders.QueueLock), then, in a later statement and
//     therefore under a fresh snapshot, look up which events were already
//     applied;
//  2. decide in Go, per entry, with the same rules for one entry or many
//     (decide): applied, or a classified rejection that writes nothing;
//  3. write the accepted entries' effects with one statement per table
//     (applied events here; orders, waiting points and history through
//     orders.QueueSave); the last round's go with one outbox append for
//     the whole batch, in one round trip.
//
// The lifecycle rules (which status accepts which report, waiting points,
// positions) are package orders'; this package maps their errors to the
// inbox's rejections (errors.go) and owns the deduplication of events.
//
// Entries of one order are applied in rounds (one entry per order per
// round), so each sees the effect of the one before. Handle is the same code
// with a batch of one.
package correlation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// AggregateType of the outbox events this package appends.
const AggregateType = "work_order"

const (
	// Which of the round's events are already applied (F6). The relation
	// outlives inbox cleanup, so it answers for the order's whole life. Read
	// under the order locks: every applier of an event locks its order first,
	// so no one can apply one of these events until we commit.
	appliedEvents = `
SELECT a.source, a.event_id
FROM work_order_applied_events a
JOIN unnest($1::text[], $2::text[]) AS k(source, event_id) USING (source, event_id)`
	// Records the accepted events. ON CONFLICT DO NOTHING plus a row count
	// check instead of a plain insert: should the lookup above ever be wrong
	// (an event id reused for another order by a buggy producer) the batch
	// fails as technical and the relay re-applies it entry by entry, where
	// the same lookup then classifies the entry as a duplicate.
	recordApplied = `
INSERT INTO work_order_applied_events (source, event_id, work_order_id, event_type, completed_items, inbox_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::int[], $6::bigint[])
ON CONFLICT (source, event_id) DO NOTHING`
)

// Handler is the work-order correlation.
type Handler struct {
	now  func() time.Time
	hops *orderhop.Recorder
}

// Option configures a Handler.
type Option func(*Handler)

// WithHops observes the correlate hop (inbox receipt → order COMPLETED) of
// every completing entry on r.
func WithHops(r *orderhop.Recorder) Option { return func(h *Handler) { h.hops = r } }

// NewHandler returns the correlation handler.
func NewHandler(opts ...Option) *Handler {
	h := &Handler{now: time.Now}
	for _, o := range opts {
		o(h)
	}
	return h
}

var (
	_ inbox.Handler      = (*Handler)(nil)
	_ inbox.BatchHandler = (*Handler)(nil)
)

// state is what an entry's decision reads, under the order lock.
type state struct {
	found   bool
	order   orders.Order
	applied bool
}

// Handle applies one inbox entry: HandleBatch with a batch of one. Errors are
// the classified rejections of errors.go; anything else (database errors) is
// technical.
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
	res, err := h.HandleBatch(ctx, tx, []*inbox.Entry{e})
	if err != nil {
		return err
	}
	return res[0]
}

// HandleBatch applies es in order (see the package comment). A rejected
// entry writes nothing; a database error fails the whole batch.
func (h *Handler) HandleBatch(ctx context.Context, tx pgx.Tx, es []*inbox.Entry) ([]error, error) {
	results := make([]error, len(es))
	events := make([]Event, len(es))
	var pending []int
	for i, e := range es {
		ev, err := Parse(e.EventType, e.SchemaVersion, e.Payload)
		if err != nil {
			results[i] = inbox.Park(inbox.ReasonPoison, err)
			continue
		}
		events[i] = ev
		pending = append(pending, i)
	}
	var out []outbox.Event
	var writes *pgx.Batch // the last round's, sent with the outbox append
	for len(pending) > 0 {
		// A round takes the first pending entry of each order; later entries
		// of the same order wait for the next round, which reads this one's
		// writes (same transaction, later statements).
		if writes != nil {
			if err := tx.SendBatch(ctx, writes).Close(); err != nil {
				return nil, err
			}
		}
		var round, next []int
		seen := make(map[uuid.UUID]bool, len(pending))
		for _, i := range pending {
			if seen[events[i].OrderID] {
				next = append(next, i)
				continue
			}
			seen[events[i].OrderID] = true
			round = append(round, i)
		}
		evs, b, err := h.applyRound(ctx, tx, es, events, round, results)
		if err != nil {
			return nil, err
		}
		out, writes = append(out, evs...), b
		pending = next
	}
	// The last round's writes and one INSERT for every completion of the
	// batch (one NOTIFY on commit), in one round trip.
	switch {
	case len(out) > 0:
		if err := (outbox.Writer{}).AppendWith(ctx, tx, writes, out...); err != nil {
			return nil, fmt.Errorf("write the batch's effects: %w", err)
		}
	case writes != nil:
		if err := tx.SendBatch(ctx, writes).Close(); err != nil {
			return nil, err
		}
	}
	return results, nil
}

// applyRound reads and decides entries of distinct orders, setting results
// for them, and returns their outbox events and their writes, queued for
// the caller to send (nil: none).
func (h *Handler) applyRound(ctx context.Context, tx pgx.Tx, es []*inbox.Entry, events []Event, round []int, results []error) ([]outbox.Event, *pgx.Batch, error) {
	states, err := h.readStates(ctx, tx, es, events, round)
	if err != nil {
		return nil, nil, err
	}
	var w writes
	var out []outbox.Event
	for _, i := range round {
		ev := events[i]
		st := states.get(ev.OrderID)
		st.applied = states.applied(es[i].Source, ev.EventID)
		o, complete, err := decide(ev, st)
		if err != nil {
			results[i] = err
			continue
		}
		w.add(es[i], ev, o)
		if complete {
			evt, err := h.completionRecorded(ctx, es[i], ev, *o)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, evt)
		}
	}
	return out, w.batch(), nil
}

// roundStates is what a round read: each locked order with its open waiting
// points, and the round's events already applied (key source + "\x00" + id).
type roundStates struct {
	byOrder     map[uuid.UUID]*orders.Order
	appliedKeys map[string]bool
}

// get returns the zero state (not found) for an order that does not exist.
func (s roundStates) get(id uuid.UUID) state {
	if o := s.byOrder[id]; o != nil {
		return state{found: true, order: *o}
	}
	return state{}
}

func (s roundStates) applied(source, eventID string) bool {
	return s.appliedKeys[source+"\x00"+eventID]
}

// readStates runs the reads of a round in one round trip (pipelined; each
// statement still gets its own snapshot, after the previous finished).
func (h *Handler) readStates(ctx context.Context, tx pgx.Tx, es []*inbox.Entry, events []Event, round []int) (roundStates, error) {
	ids := make([]uuid.UUID, len(round))
	sources := make([]string, len(round))
	eventIDs := make([]string, len(round))
	for k, i := range round {
		ids[k], sources[k], eventIDs[k] = events[i].OrderID, es[i].Source, events[i].EventID
	}
	s := roundStates{byOrder: make(map[uuid.UUID]*orders.Order, len(round)), appliedKeys: map[string]bool{}}
	b := &pgx.Batch{}
	orders.QueueLock(b, ids, s.byOrder)
	b.Queue(appliedEvents, sources, eventIDs).Query(func(rows pgx.Rows) error {
		var source, eventID string
		_, err := pgx.ForEachRow(rows, []any{&source, &eventID}, func() error {
			s.appliedKeys[source+"\x00"+eventID] = true
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return roundStates{}, fmt.Errorf("lock work orders and waiting points: %w", err)
	}
	return s, nil
}

// decide is the whole classification (ADR 0008), on state read under the
// order lock. Its precedence is the contract: unknown order, then duplicate,
// then what the order's lifecycle says (its status, then its waiting
// points, then the positions: orders.Order.Complete). It returns the order
// with the entry's change recorded, and whether the entry completed it.
func decide(ev Event, st state) (*orders.Order, bool, error) {
	id := ev.OrderID.String()
	if !st.found {
		return nil, false, &UnknownOrderError{OrderID: id}
	}
	if st.applied {
		return nil, false, &AlreadyAppliedError{OrderID: id, EventID: ev.EventID}
	}
	o := st.order
	cause := "inbox:" + ev.EventID
	if ev.Type == TypeExecutionStarted {
		if err := o.RecordExecutionStarted(cause + ":execution-started"); err != nil {
			return nil, false, rejection(ev, st.order, err)
		}
		return &o, false, nil
	}
	complete, err := o.Complete(int32(ev.CompletedItems), cause)
	if err != nil {
		return nil, false, rejection(ev, st.order, err)
	}
	return &o, complete, nil
}

// rejection maps the lifecycle's refusal of ev by order o to the
// correlation's classified rejections; anything else stays technical.
func rejection(ev Event, o orders.Order, err error) error {
	id := ev.OrderID.String()
	var (
		illegal *orders.IllegalTransitionError
		waiting *orders.WaitingPointError
		excess  *orders.ExcessItemsError
	)
	switch {
	case errors.As(err, &illegal) && illegal.From == orders.StatusCreated:
		// F5: the report overtook the hand-off.
		return &NotWaitingError{OrderID: id, Status: string(illegal.From)}
	case errors.As(err, &illegal) && illegal.From == orders.StatusCancelled:
		return &OrderCancelledError{OrderID: id}
	case errors.As(err, &illegal), errors.As(err, &excess):
		// A new tranche (not a duplicate: checked by event id) for a
		// finished order, or one past its positions.
		return &OverCompletionError{OrderID: id, Positions: int(o.Positions), Completed: int(o.CompletedItems), Increment: ev.CompletedItems}
	case errors.As(err, &waiting) && len(waiting.Open) == 0:
		return &NotWaitingError{OrderID: id, Status: string(waiting.Status) + " without an open waiting point"}
	case errors.As(err, &waiting):
		return &AmbiguousError{OrderID: id, WaitingPoints: waiting.Open}
	}
	return err
}

// writes collects a round's accepted effects: the applied events as columns
// for the set-based insert, the changed orders for orders.QueueSave.
type writes struct {
	sources, eventIDs, eventTypes []string
	appliedOrders                 []uuid.UUID
	appliedItems                  []int32
	inboxIDs                      []int64
	changed                       []*orders.Order
}

func (w *writes) add(e *inbox.Entry, ev Event, o *orders.Order) {
	w.sources = append(w.sources, e.Source)
	w.eventIDs = append(w.eventIDs, ev.EventID)
	w.eventTypes = append(w.eventTypes, ev.Type)
	w.appliedOrders = append(w.appliedOrders, ev.OrderID)
	w.appliedItems = append(w.appliedItems, int32(ev.CompletedItems))
	w.inboxIDs = append(w.inboxIDs, e.ID)
	w.changed = append(w.changed, o)
}

// batch queues the round's writes, for one round trip (pipelined), each
// checking that it touched exactly the rows decided on; nil when there are
// none.
func (w *writes) batch() *pgx.Batch {
	if len(w.eventIDs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(recordApplied, w.sources, w.eventIDs, w.appliedOrders, w.eventTypes, w.appliedItems, w.inboxIDs).
		Exec(rowsExpected("record applied events", len(w.eventIDs)))
	orders.QueueSave(b, w.changed...)
	return b
}

// errRowCount is a write that did not touch the rows decided on under the
// locks: impossible unless a lock was bypassed. Technical, so the relay
// retries the entries one by one rather than parking anything.
var errRowCount = errors.New("row count differs from the decision")

func rowsExpected(what string, n int) func(pgconn.CommandTag) error {
	return func(tag pgconn.CommandTag) error {
		if int(tag.RowsAffected()) != n {
			return fmt.Errorf("%s: %w: %d rows, want %d", what, errRowCount, tag.RowsAffected(), n)
		}
		return nil
	}
}

// completionRecorded is the event announcing o's completion, for billing.
func (h *Handler) completionRecorded(ctx context.Context, e *inbox.Entry, ev Event, o orders.Order) (outbox.Event, error) {
	eventID, err := uuid.NewV7()
	if err != nil {
		return outbox.Event{}, err
	}
	now := h.now().UTC()
	h.hops.Observe(ctx, orderhop.Correlate, e.ReceivedAt, now)
	msg := &eventsv1.WorkOrderCompletionRecorded{
		EventId:        eventID.String(),
		WorkOrderId:    ev.OrderID.String(),
		CustomerId:     o.CustomerID,
		Description:    o.Description,
		Positions:      o.Positions,
		CompletedItems: o.CompletedItems,
		UnitPrice:      &moneyv1.Money{CurrencyCode: o.UnitPrice.CurrencyCode, MinorUnits: o.UnitPrice.MinorUnits},
		CompletedAt:    timestamppb.New(now),
	}
	out, err := outbox.NewEvent(ctx, AggregateType, ev.OrderID.String(), msg)
	if err != nil {
		return outbox.Event{}, err
	}
	// NewEvent put the trace context of ctx in the headers: the inbox
	// relay's span, which links to the span that stored the entry, so the
	// dispatch of this event links back along the chain (docs/adr/0009).
	// Untraced here, the entry's own context passes on unchanged, so a
	// traced consumer downstream still links to the traced producer.
	if out.Headers[outbox.HeaderTraceparent] == "" && e.Traceparent != "" {
		out.Headers[outbox.HeaderTraceparent] = e.Traceparent
		if e.Tracestate != "" {
			out.Headers[outbox.HeaderTracestate] = e.Tracestate
		}
	}
	out.ID, out.OccurredAt = eventID, now
	out.Headers[outbox.HeaderCorrelationID] = "inbox:" + ev.EventID
	return out, nil
}
