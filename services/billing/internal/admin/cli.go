package admin

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// CLIUsage documents `billing dead-letters ...`, `billing parked ...`,
// `billing jobs retry` and `billing outbox requeue`. Running the binary with
// the database credentials is the privilege; ticket and actor make each run
// audited (operator_audit).
const CLIUsage = `usage: billing dead-letters|parked|jobs|outbox <command> [flags]

commands:
  jobs retry          -id N [-id M ...] -ticket T -actor A [-dry-run]
                      requeue dead invoice jobs with a fresh attempt budget
  dead-letters replay -ticket T -actor A -max N [-message-ids a,b] [-dry-run]
                      replay the dead letters of billing.workorder-events through the intake
  parked list         [-work-order UUID] [-after-id N] [-limit 100]
                      print the open parked messages as JSON lines, oldest first
  parked replay       -id N -ticket T -actor A [-dry-run]
                      consume a parked message through the intake, once its cause is fixed
  outbox requeue      -ids <uuid,...> -ticket T -actor A [-dry-run]
                      move FAILED outbox events back to PENDING with a fresh attempt budget
                      (at most 500); events not FAILED are reported and left alone
`

// ErrUsage is returned for a malformed command line.
var ErrUsage = errors.New("usage")

// RunCLI runs `billing <group> <command> [flags]`; group is dead-letters,
// parked, jobs (retry only) or outbox (requeue only), args start with the
// command.
func RunCLI(ctx context.Context, group string, args []string, ops *Ops, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("admin: RunCLI needs ops and an output")
	}
	cmd := ""
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	// key is the command, "" when unknown.
	var key string
	switch group {
	case "dead-letters":
		if cmd == "replay" {
			key = group + " " + cmd
		}
	case "jobs":
		if cmd == "retry" {
			key = group + " " + cmd
		}
	case "outbox":
		if cmd == "requeue" {
			key = group + " " + cmd
		}
	case "parked":
		switch cmd {
		case "list", "replay":
			key = group + " " + cmd
		}
	}
	fs := flag.NewFlagSet("billing "+group+" "+cmd, flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		a                  Authorization
		msgIDs, workOrder  string
		eventIDs           string
		id, afterID        int64
		maxMessages, limit int
		dryRun             bool
		jobIDs             jobIDList
	)
	authFlags := func() {
		fs.StringVar(&a.Ticket, "ticket", "", "change or incident reference (required)")
		fs.StringVar(&a.Actor, "actor", "", "who acts (required)")
		fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing")
	}
	switch key {
	case "dead-letters replay":
		authFlags()
		fs.IntVar(&maxMessages, "max", 0, "dead letters to take (1..1000, required)")
		fs.StringVar(&msgIDs, "message-ids", "", "comma-separated Pub/Sub message ids")
	case "parked list":
		fs.StringVar(&workOrder, "work-order", "", "only the messages about this work order")
		fs.Int64Var(&afterID, "after-id", 0, "page after this id")
		fs.IntVar(&limit, "limit", 100, "max messages (<= 1000)")
	case "parked replay":
		authFlags()
		fs.Int64Var(&id, "id", 0, "parked message id (required)")
	case "jobs retry":
		authFlags()
		fs.Var(&jobIDs, "id", "dead job id to requeue (repeatable, required)")
	case "outbox requeue":
		authFlags()
		fs.StringVar(&eventIDs, "ids", "", "comma-separated outbox event ids (required)")
	default:
		_, _ = io.WriteString(out, CLIUsage)
		return fmt.Errorf("%w: unknown command %q", ErrUsage, strings.TrimSpace(group+" "+cmd))
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	switch key {
	case "dead-letters replay":
		req := DeadLetterRequest{Authorization: a, MaxMessages: maxMessages, DryRun: dryRun}
		if msgIDs != "" {
			req.MessageIDs = strings.Split(msgIDs, ",")
		}
		res, err := ops.ReplayDeadLetters(ctx, req)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d dead letters %v (enqueued %d, duplicate %d, order_already_queued %d, parked %d, unknown_type %d)\n",
			verb(res.DryRun, "would replay", "replayed"), len(res.MessageIDs), res.MessageIDs, res.Outcomes[intake.OutcomeEnqueued],
			res.Outcomes[intake.OutcomeDuplicate], res.Outcomes[intake.OutcomeOrderAlreadyQueued], res.Outcomes[intake.OutcomeParked],
			res.Outcomes[intake.OutcomeUnknownType])
		return err
	case "parked list":
		ms, err := ops.ListParked(ctx, parked.ListFilter{Subject: workOrder, AfterID: afterID, Limit: limit})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(out)
		for _, m := range ms {
			if err := enc.Encode(listed(m)); err != nil {
				return err
			}
		}
		return nil
	case "jobs retry":
		ids, err := ops.RetryJobs(ctx, RetryJobsRequest{Authorization: a, IDs: jobIDs, DryRun: dryRun})
		if err != nil {
			return err
		}
		return json.NewEncoder(out).Encode(map[string]any{"requested": []int64(jobIDs), "dry_run": dryRun, "requeued": ids})
	case "outbox requeue":
		if eventIDs == "" {
			return fmt.Errorf("%w: billing outbox requeue: -ids is required", ErrUsage)
		}
		ids, err := parseEventIDs(strings.Split(eventIDs, ","))
		if err != nil {
			return fmt.Errorf("%w: -ids: %w", ErrUsage, err)
		}
		res, err := ops.RequeueOutbox(ctx, OutboxRequeueRequest{Authorization: a, EventIDs: ids, DryRun: dryRun})
		if err != nil {
			return err
		}
		skipped := map[string]string{}
		for _, s := range res.Skipped {
			skipped[s.EventID.String()] = string(s.State)
		}
		return json.NewEncoder(out).Encode(map[string]any{"dry_run": res.DryRun, "requeued": requeuedIDs(res), "skipped": skipped})
	default: // parked replay
		outcome, err := ops.ReplayParked(ctx, ParkedReplayRequest{Authorization: a, ID: id, DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s parked message %d: %s\n", verb(dryRun, "would replay", "replayed"), id, outcome)
		return err
	}
}

// jobIDList collects a repeated -id flag.
type jobIDList []int64

func (l *jobIDList) String() string { return fmt.Sprint(*l) }

func (l *jobIDList) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("job id %q: want a positive integer", s)
	}
	*l = append(*l, n)
	return nil
}

// parkedLine is a parked message as `billing parked list` prints it: the
// payload's size, not the payload.
type parkedLine struct {
	ID           int64             `json:"id"`
	Subscription string            `json:"subscription"`
	MessageID    string            `json:"message_id"`
	EventID      string            `json:"event_id,omitempty"`
	EventType    string            `json:"event_type,omitempty"`
	WorkOrderID  string            `json:"work_order_id,omitempty"`
	Attributes   map[string]string `json:"attributes"`
	DataBytes    int               `json:"data_bytes"`
	Reason       string            `json:"reason"`
	ParkedAt     time.Time         `json:"parked_at"`
}

func listed(p parked.Parked) parkedLine {
	return parkedLine{ID: p.ID, Subscription: p.Subscription, MessageID: p.MessageID, EventID: p.EventID, EventType: p.EventType,
		WorkOrderID: p.Subject, Attributes: p.Attributes, DataBytes: len(p.Data), Reason: p.Reason, ParkedAt: p.ParkedAt}
}

func verb(dry bool, would, did string) string {
	if dry {
		return "dry run: " + would
	}
	return did
}
