package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Billing's outbox (InvoiceIssued): the operator read of its events and the
// requeue of FAILED ones (docs/runbooks/outbox-relay-stalled.md, Remediation
// step 3), from the CLI (`billing outbox requeue`) and over gRPC.

// OutboxRequeueRequest names FAILED outbox events to requeue.
type OutboxRequeueRequest struct {
	Authorization
	// EventIDs of the events, 1..outbox.MaxRequeueEvents; only FAILED ones
	// are touched.
	EventIDs []uuid.UUID
	// DryRun reports which of the events are FAILED and would be requeued;
	// nothing changes but the audit row.
	DryRun bool
}

// RequeueOutbox moves the FAILED events among EventIDs back to PENDING with
// a fresh attempt budget (outbox.Requeuer: "requeued by <actor>, ticket
// <ticket>; was: <error>" in last_error) and audits the call in
// operator_audit (action outbox.requeue), a dry run too, in the same
// transaction.
func (o *Ops) RequeueOutbox(ctx context.Context, req OutboxRequeueRequest) (res outbox.RequeueResult, err error) {
	if err := req.Validate(); err != nil {
		return outbox.RequeueResult{}, err
	}
	note := fmt.Sprintf("requeued by %s, ticket %s", strings.TrimSpace(req.Actor), strings.TrimSpace(req.Ticket))
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		res, err = o.requeue.Requeue(ctx, tx, outbox.RequeueRequest{EventIDs: req.EventIDs, Note: note, DryRun: req.DryRun})
		if err != nil {
			return err
		}
		requested := make([]string, len(req.EventIDs))
		for i, id := range req.EventIDs {
			requested[i] = id.String()
		}
		skipped := map[string]string{}
		for _, s := range res.Skipped {
			skipped[s.EventID.String()] = string(s.State)
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "outbox.requeue", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: map[string]any{"requested": requested, "requeued": requeuedIDs(res), "skipped": skipped},
			Affected: len(res.Requeued)})
	})
	if errors.Is(err, outbox.ErrInvalidRequeue) {
		return outbox.RequeueResult{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err != nil {
		return outbox.RequeueResult{}, err
	}
	return res, nil
}

func requeuedIDs(res outbox.RequeueResult) []string {
	ids := make([]string, len(res.Requeued))
	for i, ev := range res.Requeued {
		ids[i] = ev.EventID.String()
	}
	return ids
}

// parseEventIDs parses outbox event ids (request validation has checked
// them on a served API).
func parseEventIDs(ss []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(ss))
	for _, s := range ss {
		id, err := uuid.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: event id %q is not a UUID", ErrInvalidRequest, s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
