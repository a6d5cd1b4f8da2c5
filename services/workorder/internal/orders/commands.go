package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// The use cases of the API. A handler owns its transaction (a pgdb.Tx: the
// outbox relay is woken after the commit, in its round trip), the
// idempotency key and the counters; its caller only turns a request into a
// command and the outcome into a response.

// CreateOrder is the command that creates a work order.
type CreateOrder struct {
	// Order is the new order, fresh from New.
	Order Order
	// IdempotencyKey, when not empty, makes the create happen at most once
	// per key and Order.CreatedBy (the caller) within the key store's
	// retention (pkg/idempotency): a retry
	// gets the first create's response back, replayed.
	IdempotencyKey string
	// Request is what the key is bound to, hashed (idempotency.RequestHash):
	// the same key with another request is refused (idempotency.ErrMismatch).
	// Required with a key.
	Request proto.Message
}

// CreateHandler handles CreateOrder. R is the response its idempotency key
// stores and replays: the caller's representation of the created order
// (the API's response message), built by the respond function it was
// constructed with.
type CreateHandler[R proto.Message] struct {
	db      pgdb.DB
	keys    *idempotency.Store
	scope   string
	respond func(Order) R
	log     *slog.Logger
	created metric.Int64Counter
}

// NewCreateHandler returns a CreateHandler writing through db (the pool) and
// recording keys in keys under scope (the operation's name, e.g. the gRPC
// method; the order's creator is the key's principal). respond
// builds the response stored with a key. A nil meter disables metrics.
func NewCreateHandler[R proto.Message](db pgdb.DB, keys *idempotency.Store, scope string, respond func(Order) R, logger *slog.Logger, meter metric.Meter) (*CreateHandler[R], error) {
	switch {
	case db == nil:
		return nil, errors.New("orders: db is nil")
	case keys == nil:
		return nil, errors.New("orders: idempotency store is nil")
	case scope == "":
		return nil, errors.New("orders: idempotency scope is empty")
	case respond == nil:
		return nil, errors.New("orders: respond is nil")
	case logger == nil:
		return nil, errors.New("orders: logger is nil")
	}
	meter = telemetry.MeterOrNoop(meter)
	created, err := meter.Int64Counter("workorder.orders.created", metric.WithDescription("Work orders created (replays excluded)."))
	if err != nil {
		return nil, fmt.Errorf("orders: metrics: %w", err)
	}
	return &CreateHandler[R]{db: db, keys: keys, scope: scope, respond: respond, log: logger, created: created}, nil
}

// Handle stores the order, its first transition and its hand-off event in
// one transaction, with the idempotency key if cmd has one, and wakes the
// outbox relay after the commit: three round trips (BEGIN with the key's
// claim, the order with its event, the key's response with COMMIT and the
// wake-up). It returns the response built from the stored order, or the
// first create's with replayed = true. Errors: idempotency.ErrMismatch,
// ErrInFlight and key validation errors, or a database error.
func (h *CreateHandler[R]) Handle(ctx context.Context, cmd CreateOrder) (resp R, replayed bool, err error) {
	var zero R
	// Pipelined (ADR 0023): the key's claim and the transaction's
	// timestamp travel with the BEGIN, the order with its event, the key's
	// response with the COMMIT and the outbox relay's wake-up.
	first, last := &pgx.Batch{}, &pgx.Batch{}
	var claim *idempotency.Claim
	if cmd.IdempotencyKey != "" {
		if cmd.Request == nil {
			return zero, false, errors.New("orders: create with an idempotency key needs its request")
		}
		ireq, err := idempotency.NewRequest(h.scope, cmd.IdempotencyKey, cmd.Request)
		if err != nil {
			return zero, false, err
		}
		ireq.Principal = cmd.Order.CreatedBy // another caller's same key is another order
		if claim, err = h.keys.QueueClaim(first, ireq); err != nil {
			return zero, false, err
		}
	}
	var at time.Time
	first.Queue(qNow).QueryRow(func(row pgx.Row) error { return row.Scan(&at) })
	tx, err := pgdb.Begin(ctx, h.db, h.log)
	if err != nil {
		return zero, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after the commit: a no-op
	if err := tx.SendBatch(ctx, first).Close(); err != nil {
		return zero, false, err
	}
	create := func(ctx context.Context) (R, error) {
		stored, err := InTx(tx).create(ctx, cmd.Order, at)
		if err != nil {
			return zero, err
		}
		return h.respond(stored), nil
	}
	if claim == nil {
		resp, err = create(ctx)
	} else {
		resp, replayed, err = idempotency.Finish(ctx, claim, tx, create, last)
	}
	if err == nil {
		err = tx.CommitWith(ctx, last)
	}
	if err != nil {
		return zero, false, err
	}
	if replayed {
		h.log.InfoContext(ctx, "work order create replayed from its idempotency key", "idempotency_key", cmd.IdempotencyKey)
		return resp, true, nil
	}
	h.created.Add(ctx, 1)
	h.log.DebugContext(ctx, "work order created", "work_order_id", cmd.Order.ID)
	return resp, false, nil
}

// CancelOrder is the command that cancels a work order.
type CancelOrder struct {
	ID     uuid.UUID
	Reason string
}

// CancelHandler handles CancelOrder.
type CancelHandler struct {
	db        pgdb.DB
	log       *slog.Logger
	cancelled metric.Int64Counter
}

// NewCancelHandler returns a CancelHandler writing through db (the pool). A
// nil meter disables metrics.
func NewCancelHandler(db pgdb.DB, logger *slog.Logger, meter metric.Meter) (*CancelHandler, error) {
	switch {
	case db == nil:
		return nil, errors.New("orders: db is nil")
	case logger == nil:
		return nil, errors.New("orders: logger is nil")
	}
	meter = telemetry.MeterOrNoop(meter)
	cancelled, err := meter.Int64Counter("workorder.orders.cancelled", metric.WithDescription("Work orders cancelled."))
	if err != nil {
		return nil, fmt.Errorf("orders: metrics: %w", err)
	}
	return &CancelHandler{db: db, log: logger, cancelled: cancelled}, nil
}

// Handle cancels an order that has not been handed off and returns it. A
// cancelled order is returned unchanged (idempotent). Handed off or later:
// an *IllegalTransitionError. Unknown id: ErrNotFound.
//
// Cancel and the hand-off's acceptance both take the order's row lock, so
// exactly one of them sees CREATED. When cancel wins while the provider
// call is in flight, the order stays CANCELLED (see AcceptedAfterCancel).
func (h *CancelHandler) Handle(ctx context.Context, cmd CancelOrder) (Order, error) {
	var (
		o            Order
		wasCancelled bool
	)
	err := pgdb.InTx(ctx, h.db, h.log, func(tx *pgdb.Tx) error {
		var err error
		o, err = InTx(tx).Update(ctx, cmd.ID, func(o *Order) error {
			wasCancelled = o.Status == StatusCancelled
			return o.Cancel(cmd.Reason)
		})
		return err
	})
	if err != nil {
		return Order{}, err
	}
	if !wasCancelled {
		h.cancelled.Add(ctx, 1)
		h.log.InfoContext(ctx, "work order cancelled", "work_order_id", o.ID)
	}
	return o, nil
}
