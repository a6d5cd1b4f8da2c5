// Package correlation applies the provider's events, stored in the inbox, to
// work orders: the inbox.Handler of the work-order service. Each call runs in
// the relay's transaction, so the order's change, its history row, its
// outbox event and the inbox entry's status commit together or not at all.
//
// A claimed batch is applied set-based (inbox.BatchHandler), in a fixed
// number of statements however many entries it holds:
//
//  1. read: lock the batch's orders (FOR UPDATE, in id order), then, in
//     later statements and therefore under fresh snapshots, lock their open
//     waiting points and look up which events were already applied;
//  2. decide in Go, per entry, with the same rules for one entry or many
//     (decide): applied, or a classified rejection that writes nothing;
//  3. write the accepted entries' effects with one statement per table
//     (applied events, orders, waiting points, history), then one outbox
//     append for the whole batch.
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
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// AggregateType of the outbox events this package appends.
const AggregateType = "work_order"

const (
	// Locks the round's orders first, in id order so that two transactions
	// locking overlapping sets cannot deadlock. Every writer of an order's
	// status or waiting points (hand-off, cancel, re-hand-off) locks the
	// order row first, so once this returns nobody else can change what the
	// following statements read. Those run as separate statements on purpose:
	// under READ COMMITTED each takes a new snapshot, taken AFTER these locks
	// were granted; folded into this statement they would share its snapshot,
	// taken before a lock wait, and miss a waiting point inserted by the
	// transaction that held the lock. Row values returned here are the latest
	// committed (a locked row is re-read after the wait).
	lockOrders = `
SELECT id, status, positions, completed_items, customer_id, description, currency_code, unit_price_minor
FROM work_orders WHERE id = ANY($1::uuid[])
ORDER BY id
FOR UPDATE`
	// Open waiting points of the locked orders, locked too: belt and braces
	// against a writer that would touch them without the order lock; they
	// are consumed in this same transaction, so the rejection "waiting
	// point vanished between query and delivery" has no window. Partial index
	// waiting_points_open_idx.
	lockOpenWaitingPoints = `
SELECT work_order_id, id FROM waiting_points
WHERE work_order_id = ANY($1::uuid[]) AND consumed_at IS NULL
ORDER BY id
FOR UPDATE`
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
	// One completion tranche per order per round (rounds guarantee it), so
	// the join never meets an order twice. The status guard is redundant
	// under the lock; the row count check turns a violation into a retry.
	applyTranches = `
UPDATE work_orders w
SET completed_items = w.completed_items + u.items,
    status          = CASE WHEN u.complete THEN 'COMPLETED' ELSE w.status END,
    version         = w.version + 1,
    updated_at      = now()
FROM unnest($1::uuid[], $2::int[], $3::bool[]) AS u(id, items, complete)
WHERE w.id = u.id AND w.status = 'HANDED_OFF'`
	// The row count must match: a waiting point already consumed would mean
	// the locks failed, reported as technical (retry), never parked.
	consumeWaitingPoints = `
UPDATE waiting_points w
SET consumed_at = now(), consumed_by = u.cause
FROM unnest($1::bigint[], $2::text[]) AS u(id, cause)
WHERE w.id = u.id AND w.consumed_at IS NULL`
	// unnest keeps the array order, so history ids follow the entries' order.
	insertTransitions = `
INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[])`
)

// Handler is the work-order correlation.
type Handler struct {
	now func() time.Time
}

// NewHandler returns the correlation handler.
func NewHandler() *Handler { return &Handler{now: time.Now} }

var (
	_ inbox.Handler      = (*Handler)(nil)
	_ inbox.BatchHandler = (*Handler)(nil)
)

type order struct {
	status                       string
	positions, completed         int
	customerID, description, ccy string
	unitPriceMinor               int64
}

// state is what an entry's decision reads, under the order lock.
type state struct {
	found         bool
	order         order
	applied       bool
	waitingPoints []int64
}

// effect is what an accepted entry writes.
type effect struct {
	items        int   // completed items added (completion tranches only)
	complete     bool  // the tranche completes the order
	waitingPoint int64 // consumed when complete
	from, to     string
	cause        string
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
	for len(pending) > 0 {
		// A round takes the first pending entry of each order; later entries
		// of the same order wait for the next round, which reads this one's
		// writes (same transaction, later statements).
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
		evs, err := h.applyRound(ctx, tx, es, events, round, results)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
		pending = next
	}
	// One INSERT for every completion of the batch (one NOTIFY on commit).
	if err := outbox.Append(ctx, tx, out...); err != nil {
		return nil, fmt.Errorf("append completion events: %w", err)
	}
	return results, nil
}

// applyRound reads, decides and writes entries of distinct orders, setting
// results for them, and returns their outbox events.
func (h *Handler) applyRound(ctx context.Context, tx pgx.Tx, es []*inbox.Entry, events []Event, round []int, results []error) ([]outbox.Event, error) {
	states, err := readStates(ctx, tx, es, events, round)
	if err != nil {
		return nil, err
	}
	var w writes
	var out []outbox.Event
	for _, i := range round {
		ev := events[i]
		st := states.get(ev.OrderID)
		st.applied = states.applied(es[i].Source, ev.EventID)
		eff, err := decide(ev, st)
		if err != nil {
			results[i] = err
			continue
		}
		w.add(es[i], ev, eff)
		if eff.complete {
			o, err := h.completionRecorded(ctx, es[i], ev, st.order, st.order.completed+eff.items)
			if err != nil {
				return nil, err
			}
			out = append(out, o)
		}
	}
	if err := w.exec(ctx, tx); err != nil {
		return nil, err
	}
	return out, nil
}

// roundStates is what a round read: each locked order with its open waiting
// points, and the round's events already applied (key source + "\x00" + id).
type roundStates struct {
	byOrder     map[uuid.UUID]*state
	appliedKeys map[string]bool
}

// get returns the zero state (not found) for an order that does not exist.
func (s roundStates) get(id uuid.UUID) state {
	if st := s.byOrder[id]; st != nil {
		return *st
	}
	return state{}
}

func (s roundStates) applied(source, eventID string) bool {
	return s.appliedKeys[source+"\x00"+eventID]
}

// readStates runs the three reads of a round in one round trip (pipelined;
// each statement still gets its own snapshot, after the previous finished).
func readStates(ctx context.Context, tx pgx.Tx, es []*inbox.Entry, events []Event, round []int) (roundStates, error) {
	ids := make([]uuid.UUID, len(round))
	sources := make([]string, len(round))
	eventIDs := make([]string, len(round))
	for k, i := range round {
		ids[k], sources[k], eventIDs[k] = events[i].OrderID, es[i].Source, events[i].EventID
	}
	s := roundStates{byOrder: make(map[uuid.UUID]*state, len(round)), appliedKeys: map[string]bool{}}
	b := &pgx.Batch{}
	b.Queue(lockOrders, ids).Query(func(rows pgx.Rows) error {
		var (
			id uuid.UUID
			o  order
		)
		_, err := pgx.ForEachRow(rows, []any{&id, &o.status, &o.positions, &o.completed,
			&o.customerID, &o.description, &o.ccy, &o.unitPriceMinor}, func() error {
			s.byOrder[id] = &state{found: true, order: o}
			return nil
		})
		return err
	})
	b.Queue(lockOpenWaitingPoints, ids).Query(func(rows pgx.Rows) error {
		var (
			orderID uuid.UUID
			wp      int64
		)
		_, err := pgx.ForEachRow(rows, []any{&orderID, &wp}, func() error {
			if st := s.byOrder[orderID]; st != nil {
				st.waitingPoints = append(st.waitingPoints, wp)
			}
			return nil
		})
		return err
	})
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
// then the order's status, then its waiting points, then the positions.
func decide(ev Event, st state) (effect, error) {
	id := ev.OrderID.String()
	o := st.order
	if !st.found {
		return effect{}, &UnknownOrderError{OrderID: id}
	}
	if st.applied {
		return effect{}, &AlreadyAppliedError{OrderID: id, EventID: ev.EventID}
	}
	cause := "inbox:" + ev.EventID
	if ev.Type == TypeExecutionStarted {
		// Recorded in the order's history; the status stays as it is.
		switch o.status {
		case "CREATED":
			return effect{}, &NotWaitingError{OrderID: id, Status: o.status}
		case "CANCELLED":
			return effect{}, &OrderCancelledError{OrderID: id}
		case "HANDED_OFF":
			if _, err := waitingPoint(ev, st); err != nil {
				return effect{}, err
			}
		}
		return effect{from: o.status, to: o.status, cause: cause + ":execution-started"}, nil
	}
	// A completion tranche (F14: an order may complete in several); the
	// tranche that reaches the positions completes the order.
	switch o.status {
	case "CREATED":
		return effect{}, &NotWaitingError{OrderID: id, Status: o.status}
	case "CANCELLED":
		return effect{}, &OrderCancelledError{OrderID: id}
	case "COMPLETED", "INVOICED":
		// Not a duplicate (checked by event id above): a new tranche for a
		// finished order.
		return effect{}, &OverCompletionError{OrderID: id, Positions: o.positions, Completed: o.completed, Increment: ev.CompletedItems}
	}
	wp, err := waitingPoint(ev, st)
	if err != nil {
		return effect{}, err
	}
	total := o.completed + ev.CompletedItems
	if total > o.positions {
		return effect{}, &OverCompletionError{OrderID: id, Positions: o.positions, Completed: o.completed, Increment: ev.CompletedItems}
	}
	if total < o.positions {
		return effect{items: ev.CompletedItems, from: o.status, to: o.status,
			cause: fmt.Sprintf("%s:tranche %d/%d", cause, total, o.positions)}, nil
	}
	return effect{items: ev.CompletedItems, complete: true, waitingPoint: wp,
		from: "HANDED_OFF", to: "COMPLETED", cause: cause}, nil
}

// waitingPoint returns the single open waiting point of a HANDED_OFF order.
func waitingPoint(ev Event, st state) (int64, error) {
	switch len(st.waitingPoints) {
	case 0:
		return 0, &NotWaitingError{OrderID: ev.OrderID.String(), Status: st.order.status + " without an open waiting point"}
	case 1:
		return st.waitingPoints[0], nil
	default:
		return 0, &AmbiguousError{OrderID: ev.OrderID.String(), WaitingPoints: st.waitingPoints}
	}
}

// writes collects a round's accepted effects as columns for the set-based
// statements.
type writes struct {
	// work_order_applied_events
	sources, eventIDs, eventTypes []string
	appliedOrders                 []uuid.UUID
	appliedItems                  []int32
	inboxIDs                      []int64
	// work_orders
	trancheOrders []uuid.UUID
	trancheItems  []int32
	completes     []bool
	// waiting_points
	consumeIDs    []int64
	consumeCauses []string
	// work_order_transitions
	histOrders                   []uuid.UUID
	histFrom, histTo, histCauses []string
}

func (w *writes) add(e *inbox.Entry, ev Event, eff effect) {
	w.sources = append(w.sources, e.Source)
	w.eventIDs = append(w.eventIDs, ev.EventID)
	w.eventTypes = append(w.eventTypes, ev.Type)
	w.appliedOrders = append(w.appliedOrders, ev.OrderID)
	w.appliedItems = append(w.appliedItems, int32(ev.CompletedItems))
	w.inboxIDs = append(w.inboxIDs, e.ID)
	if eff.items > 0 {
		w.trancheOrders = append(w.trancheOrders, ev.OrderID)
		w.trancheItems = append(w.trancheItems, int32(eff.items))
		w.completes = append(w.completes, eff.complete)
	}
	if eff.complete {
		w.consumeIDs = append(w.consumeIDs, eff.waitingPoint)
		w.consumeCauses = append(w.consumeCauses, eff.cause)
	}
	w.histOrders = append(w.histOrders, ev.OrderID)
	w.histFrom = append(w.histFrom, eff.from)
	w.histTo = append(w.histTo, eff.to)
	w.histCauses = append(w.histCauses, eff.cause)
}

// exec runs the round's writes in one round trip (pipelined), checking that
// each touched exactly the rows decided on.
func (w *writes) exec(ctx context.Context, tx pgx.Tx) error {
	if len(w.eventIDs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(recordApplied, w.sources, w.eventIDs, w.appliedOrders, w.eventTypes, w.appliedItems, w.inboxIDs).
		Exec(rowsExpected("record applied events", len(w.eventIDs)))
	if len(w.trancheOrders) > 0 {
		b.Queue(applyTranches, w.trancheOrders, w.trancheItems, w.completes).
			Exec(rowsExpected("apply completion tranches", len(w.trancheOrders)))
	}
	if len(w.consumeIDs) > 0 {
		b.Queue(consumeWaitingPoints, w.consumeIDs, w.consumeCauses).
			Exec(rowsExpected("consume waiting points", len(w.consumeIDs)))
	}
	b.Queue(insertTransitions, w.histOrders, w.histFrom, w.histTo, w.histCauses).
		Exec(rowsExpected("record transitions", len(w.histOrders)))
	return tx.SendBatch(ctx, b).Close()
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

func (h *Handler) completionRecorded(ctx context.Context, e *inbox.Entry, ev Event, o order, total int) (outbox.Event, error) {
	eventID, err := uuid.NewV7()
	if err != nil {
		return outbox.Event{}, err
	}
	now := h.now().UTC()
	msg := &eventsv1.WorkOrderCompletionRecorded{
		EventId:        eventID.String(),
		WorkOrderId:    ev.OrderID.String(),
		CustomerId:     o.customerID,
		Description:    o.description,
		Positions:      int32(o.positions),
		CompletedItems: int32(total),
		UnitPrice:      &moneyv1.Money{CurrencyCode: o.ccy, MinorUnits: o.unitPriceMinor},
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
