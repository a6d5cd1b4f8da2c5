package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// The requeue of FAILED outbox events (docs/runbooks/outbox-relay-stalled.md,
// Remediation step 3): the CLI (RunOutboxCLI) and the gRPC service call
// RequeueOutbox.

// OutboxRequeueRequest names FAILED outbox events to requeue.
type OutboxRequeueRequest struct {
	inbox.Authorization
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
		return outbox.RequeueResult{}, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	note := fmt.Sprintf("requeued by %s, ticket %s", strings.TrimSpace(req.Actor), strings.TrimSpace(req.Ticket))
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		res, err = o.requeue.Requeue(ctx, tx, outbox.RequeueRequest{EventIDs: req.EventIDs, Note: note, DryRun: req.DryRun})
		if err != nil {
			return err
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "outbox.requeue", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: requeueParams(req.EventIDs, res), Affected: len(res.Requeued)})
	})
	if errors.Is(err, outbox.ErrInvalidRequeue) {
		return outbox.RequeueResult{}, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	if err != nil {
		return outbox.RequeueResult{}, err
	}
	return res, nil
}

// requeueParams are the audit row's params of a requeue.
func requeueParams(asked []uuid.UUID, res outbox.RequeueResult) map[string]any {
	requested := make([]string, len(asked))
	for i, id := range asked {
		requested[i] = id.String()
	}
	skipped := map[string]string{}
	for _, s := range res.Skipped {
		skipped[s.EventID.String()] = string(s.State)
	}
	return map[string]any{"requested": requested, "requeued": requeuedIDs(res), "skipped": skipped}
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
			return nil, fmt.Errorf("%w: event id %q is not a UUID", inbox.ErrInvalidRequest, s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// OutboxCLIUsage documents `workorder outbox ...`.
const OutboxCLIUsage = `usage: workorder outbox <command> [flags]

commands:
  requeue --ticket T --actor A --ids <uuid,...> [--dry-run]
          move FAILED outbox events back to PENDING with a fresh attempt budget (at most 500);
          events not FAILED are reported and left alone
`

// RunOutboxCLI runs one `workorder outbox` command; args exclude "outbox".
func RunOutboxCLI(ctx context.Context, args []string, ops *Ops, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("admin: RunOutboxCLI needs ops and an output")
	}
	if len(args) == 0 || args[0] != "requeue" {
		_, _ = io.WriteString(out, OutboxCLIUsage)
		if len(args) == 0 {
			return ErrUsage
		}
		return fmt.Errorf("%w: unknown command %q", ErrUsage, args[0])
	}
	fs := flag.NewFlagSet("workorder outbox requeue", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		ticket, actor, ids string
		dryRun             bool
	)
	fs.StringVar(&ticket, "ticket", "", "change or incident reference (required)")
	fs.StringVar(&actor, "actor", "", "who acts (required)")
	fs.StringVar(&ids, "ids", "", "comma-separated outbox event ids (required)")
	fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if ids == "" {
		return fmt.Errorf("%w: workorder outbox requeue: --ids is required", ErrUsage)
	}
	eventIDs, err := parseEventIDs(strings.Split(ids, ","))
	if err != nil {
		return fmt.Errorf("%w: --ids: %w", ErrUsage, err)
	}
	res, err := ops.RequeueOutbox(ctx, OutboxRequeueRequest{Authorization: inbox.Authorization{Ticket: ticket, Actor: actor},
		EventIDs: eventIDs, DryRun: dryRun})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s %d FAILED outbox events: %v\n", verb(res.DryRun, "would requeue", "requeued"), len(res.Requeued), requeuedIDs(res))
	for _, s := range res.Skipped {
		state := string(s.State)
		if state == "" {
			state = "unknown"
		}
		_, err = fmt.Fprintf(out, "not requeued: %s (%s)\n", s.EventID, state)
	}
	return err
}
