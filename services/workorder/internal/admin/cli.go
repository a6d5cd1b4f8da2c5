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
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/inbox"
)

// CLIUsage documents `workorder inbox ...`. Running the binary with the
// database credentials is the privilege; ticket and actor make it audited.
const CLIUsage = `usage: workorder inbox <command> [flags]

commands:
  list     [--status PARKED|OPEN|APPLIED|DUPLICATE] [--reason R] [--after-id N] [--limit N]
  show     --id N                                   (prints the entry as JSON, payload base64)
  replay   --ticket T --actor A (--ids 1,2,3 | --from RFC3339 --to RFC3339) [--reason R] [--dry-run]
  replay-dead-letters --ticket T --actor A --max N [--message-ids a,b] [--dry-run]
  cleanup  --ticket T --actor A [--retention 744h] [--dry-run]
  re-hand-off --ticket T --actor A --order UUID     (records a second waiting point: F7)
`

// ErrUsage is returned for a malformed command line.
var ErrUsage = errors.New("usage")

// RunCLI runs one `workorder inbox` command; args exclude "inbox".
func RunCLI(ctx context.Context, args []string, ops *Ops, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("admin: RunCLI needs ops and an output")
	}
	if len(args) == 0 {
		_, _ = io.WriteString(out, CLIUsage)
		return ErrUsage
	}
	fs := flag.NewFlagSet("workorder inbox "+args[0], flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		status, reason, ids, from, to, ticket, actor, msgIDs, order string
		afterID, id                                                 int64
		limit, maxMessages                                          int
		dryRun                                                      bool
		retention                                                   time.Duration
	)
	authFlags := func() {
		fs.StringVar(&ticket, "ticket", "", "change or incident reference (required)")
		fs.StringVar(&actor, "actor", "", "who acts (required)")
	}
	switch args[0] {
	case "list":
		fs.StringVar(&status, "status", "PARKED", "entry status")
		fs.StringVar(&reason, "reason", "", "park reason")
		fs.Int64Var(&afterID, "after-id", 0, "page after this id")
		fs.IntVar(&limit, "limit", 50, "max entries (<= 1000)")
	case "show":
		fs.Int64Var(&id, "id", 0, "entry id")
	case "replay":
		authFlags()
		fs.StringVar(&ids, "ids", "", "comma-separated entry ids")
		fs.StringVar(&from, "from", "", "received at or after (RFC 3339)")
		fs.StringVar(&to, "to", "", "received before (RFC 3339)")
		fs.StringVar(&reason, "reason", "", "only this park reason")
		fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing")
	case "replay-dead-letters":
		authFlags()
		fs.IntVar(&maxMessages, "max", 0, "dead letters to take (1..1000, required)")
		fs.StringVar(&msgIDs, "message-ids", "", "comma-separated Pub/Sub message ids")
		fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing")
	case "cleanup":
		authFlags()
		fs.DurationVar(&retention, "retention", inbox.DefaultRetention, "delete resolved entries older than this (>= 24h)")
		fs.BoolVar(&dryRun, "dry-run", false, "count, delete nothing")
	case "re-hand-off":
		authFlags()
		fs.StringVar(&order, "order", "", "work order id")
	default:
		_, _ = io.WriteString(out, CLIUsage)
		return fmt.Errorf("%w: unknown command %q", ErrUsage, args[0])
	}
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	a := inbox.Authorization{Ticket: ticket, Actor: actor}
	switch args[0] {
	case "list":
		es, err := ops.Inbox().List(ctx, inbox.ListFilter{Status: inbox.Status(strings.ToUpper(status)), Reason: reason, AfterID: afterID, Limit: limit})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		_, _ = fmt.Fprintln(tw, "ID\tSTATUS\tREASON\tEVENT_TYPE\tEVENT_ID\tORDER\tATTEMPTS\tRECEIVED\tLAST_ERROR")
		for _, e := range es {
			_, _ = fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Status, e.ParkReason, e.EventType, e.EventID,
				e.CorrelationKey, e.Attempts, e.ReceivedAt.UTC().Format(time.RFC3339), oneLine(e.LastError, 120))
		}
		return tw.Flush()
	case "show":
		e, err := ops.Inbox().Get(ctx, id)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(e)
	case "replay":
		req := inbox.ReplayRequest{Authorization: a, Reason: reason, DryRun: dryRun}
		var err error
		if req.IDs, err = parseIDs(ids); err != nil {
			return err
		}
		if req.From, err = parseTime(from); err != nil {
			return err
		}
		if req.To, err = parseTime(to); err != nil {
			return err
		}
		res, err := ops.Inbox().Replay(ctx, req)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d parked entries: %v\n", verb(res.DryRun, "would reopen", "reopened"), len(res.IDs), res.IDs)
		return err
	case "replay-dead-letters":
		req := DeadLetterRequest{Authorization: a, MaxMessages: maxMessages, DryRun: dryRun}
		if msgIDs != "" {
			req.MessageIDs = strings.Split(msgIDs, ",")
		}
		res, err := ops.ReplayDeadLetters(ctx, req)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d dead letters %v (inserted %d, duplicates %d, poison %d, conflicts %d)\n",
			verb(res.DryRun, "would re-enter", "re-entered"), len(res.MessageIDs), res.MessageIDs, res.Inserted, res.Duplicates, res.Poison, res.Conflicts)
		return err
	case "cleanup":
		n, err := ops.Inbox().Cleanup(ctx, inbox.CleanupRequest{Authorization: a, Retention: retention, DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d resolved entries older than %s\n", verb(dryRun, "would delete", "deleted"), n, retention)
		return err
	default: // re-hand-off
		oid, err := uuid.Parse(order)
		if err != nil {
			return fmt.Errorf("%w: --order must be a work order UUID", ErrUsage)
		}
		wp, open, err := ops.RecordReHandOff(ctx, a, oid)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "recorded waiting point %d; work order %s now has %d open waiting points\n", wp, oid, open)
		return err
	}
}

func verb(dry bool, would, did string) string {
	if dry {
		return "dry run: " + would
	}
	return did
}

func parseIDs(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var out []int64
	for part := range strings.SplitSeq(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: --ids: %q is not an id", ErrUsage, part)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is not an RFC 3339 time", ErrUsage, s)
	}
	return t, nil
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
