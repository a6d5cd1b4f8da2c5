package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// Operations are the calls of OperatorService; *Service (token checked)
// and NewInProcess's (the service's own command line) are two.
type Operations interface {
	ListOutboxEvents(context.Context, *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error)
	RequeueOutboxEvents(context.Context, *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error)
	ListParkedMessages(context.Context, *opsv1.ListParkedMessagesRequest) (*opsv1.ListParkedMessagesResponse, error)
	ReplayParkedMessage(context.Context, *opsv1.ReplayParkedMessageRequest) (*opsv1.ReplayParkedMessageResponse, error)
	ReplayDeadLetters(context.Context, *opsv1.ReplayDeadLettersRequest) (*opsv1.ReplayDeadLettersResponse, error)
	ListInboxEntries(context.Context, *opsv1.ListInboxEntriesRequest) (*opsv1.ListInboxEntriesResponse, error)
	GetInboxEntry(context.Context, *opsv1.GetInboxEntryRequest) (*opsv1.GetInboxEntryResponse, error)
	ReplayInboxEntries(context.Context, *opsv1.ReplayInboxEntriesRequest) (*opsv1.ReplayInboxEntriesResponse, error)
	CleanupInbox(context.Context, *opsv1.CleanupInboxRequest) (*opsv1.CleanupInboxResponse, error)
	ListJobs(context.Context, *opsv1.ListJobsRequest) (*opsv1.ListJobsResponse, error)
	RetryJobs(context.Context, *opsv1.RetryJobsRequest) (*opsv1.RetryJobsResponse, error)
	ListOperatorAudit(context.Context, *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error)
}

// ErrUsage is returned for a malformed command line; the usage was printed.
var ErrUsage = errors.New("usage")

// CLIGroups are the first words of the commands RunCLI runs.
var CLIGroups = []string{"outbox", "parked", "dead-letters", "inbox", "jobs", "audit"}

// CLIUsage documents the operator commands of every service, after the
// service's name (`workorder outbox requeue ...`, `billing parked list`);
// a command over a store the service does not have answers UNIMPLEMENTED.
// Flags take one or two dashes. Listings print one JSON object per line
// (the API's message, proto field names); repairs print one line of text,
// "dry run: would ..." on a dry run.
const CLIUsage = `operator commands (every repair needs --ticket and --actor and is audited, dry runs too):
  outbox list          [--states PENDING,FAILED,PUBLISHED (default PENDING,FAILED)] [--aggregate-id ID] [--event-type T] [--limit 50] [--page-token T]
  outbox requeue       --ids <uuid,...> --ticket T --actor A [--dry-run]
                       move FAILED outbox events back to PENDING with a fresh attempt budget (at most 500);
                       events not FAILED are reported and left alone
  parked list          [--subject ID] [--subscription S] [--after-id N | --page-token T] [--limit 50]
                       (open parked messages, oldest first)
  parked replay        --id N [--consumer C] --ticket T --actor A [--dry-run]
                       re-apply a parked message through its consumer, once its cause is fixed
  dead-letters replay  --max N [--message-ids a,b] [--consumer C] --ticket T --actor A [--dry-run]
                       replay the consumer's dead letters through its idempotent path
  inbox list           [--status PARKED|OPEN|APPLIED|DUPLICATE (default PARKED)] [--reason R] [--after-id N] [--limit 50]
  inbox show           --id N   (the entry with its payload, base64)
  inbox replay         (--ids 1,2,3 | --from RFC3339 --to RFC3339) [--reason R] --ticket T --actor A [--dry-run]
                       reopen PARKED inbox entries so the relay applies them again
  inbox cleanup        [--retention-hours 744] --ticket T --actor A [--dry-run]
                       delete resolved inbox entries older than the retention (24..87600 h)
  jobs list            [--state available|running|done|dead] [--unique-key K] [--limit 50] [--page-token T]   (newest first)
  jobs retry           --ids 1,2,3 --ticket T --actor A [--dry-run]
                       requeue dead lease-queue jobs with a fresh attempt budget (at most 1000)
  audit list           [--action A] [--actor A] [--ticket T] [--limit 50] [--page-token T]   (newest first)
`

// RunCLI runs one operator command over ops; consumer is the default of
// --consumer (empty: the service's only one); args start with the group
// (CLIGroups).
// Errors of the operations are the API's (gRPC status errors:
// INVALID_ARGUMENT for a missing ticket, NOT_FOUND for a parked message no
// longer open, ...).
func RunCLI(ctx context.Context, args []string, ops Operations, consumer string, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("operator: RunCLI needs the operations and an output")
	}
	// cmd is "<group> <command>", empty when unknown.
	var cmd string
	if len(args) > 1 {
		known := false
		switch group, sub := args[0], args[1]; group {
		case "outbox":
			known = sub == "list" || sub == "requeue"
		case "parked":
			known = sub == "list" || sub == "replay"
		case "dead-letters":
			known = sub == "replay"
		case "inbox":
			known = sub == "list" || sub == "show" || sub == "replay" || sub == "cleanup"
		case "jobs":
			known = sub == "list" || sub == "retry"
		case "audit":
			known = sub == "list"
		}
		if known {
			cmd = args[0] + " " + args[1]
		}
		args = args[2:]
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		ticket, actor, ids, states, aggregate, eventType, pageToken    string
		subject, subscription, msgIDs, action, auditActor, auditTicket string
		status, reason, from, to, state, uniqueKey                     string
		id, afterID                                                    int64
		limit, maxMessages, retentionHours                             int
		dryRun                                                         bool
	)
	repairFlags := func() {
		fs.StringVar(&ticket, "ticket", "", "change or incident reference (required)")
		fs.StringVar(&actor, "actor", "", "who acts (required)")
		fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing but the audit row")
	}
	switch cmd {
	case "outbox list":
		fs.StringVar(&states, "states", "", "comma-separated states (PENDING, FAILED, PUBLISHED; default the undelivered: PENDING,FAILED)")
		fs.StringVar(&aggregate, "aggregate-id", "", "only this aggregate's events")
		fs.StringVar(&eventType, "event-type", "", "only this event type")
		fs.IntVar(&limit, "limit", defaultPageSize, "max events (<= 500)")
		fs.StringVar(&pageToken, "page-token", "", "next_page_token of the previous page")
	case "outbox requeue":
		repairFlags()
		fs.StringVar(&ids, "ids", "", "comma-separated outbox event ids (required)")
	case "parked list":
		fs.StringVar(&subject, "subject", "", "only the messages about this subject (the work order)")
		fs.StringVar(&subject, "work-order", "", "alias of --subject")
		fs.StringVar(&subscription, "subscription", "", "only the messages of this subscription")
		fs.Int64Var(&afterID, "after-id", 0, "page after this id")
		fs.IntVar(&limit, "limit", defaultPageSize, "max messages (<= 500)")
		fs.StringVar(&pageToken, "page-token", "", "next_page_token of the previous page (instead of --after-id)")
	case "parked replay":
		repairFlags()
		fs.Int64Var(&id, "id", 0, "parked message id (required)")
		fs.StringVar(&consumer, "consumer", consumer, "the consumer that parked it")
	case "dead-letters replay":
		repairFlags()
		fs.IntVar(&maxMessages, "max", 0, "dead letters to take (1..1000, required)")
		fs.StringVar(&msgIDs, "message-ids", "", "comma-separated Pub/Sub message ids")
		fs.StringVar(&consumer, "consumer", consumer, "the consumer whose dead letters to replay")
	case "inbox list":
		fs.StringVar(&status, "status", "PARKED", "entry status (PARKED, OPEN, APPLIED, DUPLICATE)")
		fs.StringVar(&reason, "reason", "", "only this park reason")
		fs.Int64Var(&afterID, "after-id", 0, "page after this id")
		fs.IntVar(&limit, "limit", defaultPageSize, "max entries (<= 500)")
	case "inbox show":
		fs.Int64Var(&id, "id", 0, "inbox entry id (required)")
	case "inbox replay":
		repairFlags()
		fs.StringVar(&ids, "ids", "", "comma-separated entry ids")
		fs.StringVar(&from, "from", "", "received at or after (RFC 3339)")
		fs.StringVar(&to, "to", "", "received before (RFC 3339)")
		fs.StringVar(&reason, "reason", "", "only this park reason")
	case "inbox cleanup":
		repairFlags()
		fs.IntVar(&retentionHours, "retention-hours", 0, "delete resolved entries older than this many hours (24..87600; 0: 744)")
	case "jobs list":
		fs.StringVar(&state, "state", "", "available, running, done or dead (default all)")
		fs.StringVar(&uniqueKey, "unique-key", "", "only the job with this unique key")
		fs.IntVar(&limit, "limit", defaultPageSize, "max jobs (<= 500)")
		fs.StringVar(&pageToken, "page-token", "", "next_page_token of the previous page")
	case "jobs retry":
		repairFlags()
		fs.StringVar(&ids, "ids", "", "comma-separated dead job ids (required)")
	case "audit list":
		fs.StringVar(&action, "action", "", "only this action (outbox.requeue, invoicing.replay-parked, ...)")
		fs.StringVar(&auditActor, "actor", "", "only this actor")
		fs.StringVar(&auditTicket, "ticket", "", "only this ticket")
		fs.IntVar(&limit, "limit", defaultPageSize, "max records (<= 500)")
		fs.StringVar(&pageToken, "page-token", "", "next_page_token of the previous page")
	default:
		_, _ = io.WriteString(out, CLIUsage)
		return fmt.Errorf("%w: unknown command", ErrUsage)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if limit < 0 || limit > maxPageSize {
		return fmt.Errorf("%w: %s: --limit must be 0..%d", ErrUsage, cmd, maxPageSize)
	}
	authz := &opsv1.OperatorAuthorization{Ticket: ticket, Actor: actor}
	switch cmd {
	case "outbox list":
		req := &opsv1.ListOutboxEventsRequest{States: split(strings.ToUpper(states)), AggregateId: aggregate, EventType: eventType,
			PageSize: int32(limit), PageToken: pageToken}
		res, err := ops.ListOutboxEvents(ctx, req)
		if err != nil {
			return err
		}
		return printPage(out, res.GetEvents(), res.GetNextPageToken())
	case "outbox requeue":
		if ids == "" {
			return fmt.Errorf("%w: outbox requeue: --ids is required", ErrUsage)
		}
		res, err := ops.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{Authorization: authz, EventIds: split(ids), DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d FAILED outbox events: %v\n", verb(res.GetDryRun(), "would requeue", "requeued"), len(res.GetEventIds()), res.GetEventIds())
		for _, s := range res.GetSkipped() {
			state := s.GetState()
			if state == "" {
				state = "unknown"
			}
			_, err = fmt.Fprintf(out, "not requeued: %s (%s)\n", s.GetEventId(), state)
		}
		return err
	case "parked list":
		token := pageToken
		if token == "" && afterID > 0 {
			token = EncodePageToken(afterID, subscription, subject)
		}
		res, err := ops.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{Subject: subject, Subscription: subscription,
			PageSize: int32(limit), PageToken: token})
		if err != nil {
			return err
		}
		return printPage(out, res.GetMessages(), res.GetNextPageToken())
	case "parked replay":
		if id <= 0 {
			return fmt.Errorf("%w: parked replay: --id is required", ErrUsage)
		}
		res, err := ops.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: authz, Consumer: consumer, Id: id, DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s parked message %d: %s\n", verb(res.GetDryRun(), "would replay", "replayed"), id, res.GetOutcome())
		return err
	case "dead-letters replay":
		res, err := ops.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Authorization: authz, Consumer: consumer,
			MaxMessages: int32(maxMessages), MessageIds: split(msgIDs), DryRun: dryRun})
		if err != nil {
			return err
		}
		counts := make([]string, 0, len(res.GetOutcomes())+1)
		for k, n := range res.GetOutcomes() {
			counts = append(counts, fmt.Sprintf("%s %d", k, n))
		}
		slices.Sort(counts)
		counts = append(counts, fmt.Sprintf("failed %d", len(res.GetFailedMessageIds())))
		_, err = fmt.Fprintf(out, "%s %d dead letters %v (%s)\n", verb(res.GetDryRun(), "would replay", "replayed"),
			len(res.GetMessageIds()), res.GetMessageIds(), strings.Join(counts, ", "))
		if err == nil && len(res.GetFailedMessageIds()) > 0 {
			// The others are applied and audited; the failed ones are still
			// dead letters: say so in the exit status.
			err = fmt.Errorf("operator: %d dead letters failed and were released: %v", len(res.GetFailedMessageIds()), res.GetFailedMessageIds())
		}
		return err
	case "inbox list":
		res, err := ops.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{Status: strings.ToUpper(status), Reason: reason,
			AfterId: afterID, PageSize: int32(limit)})
		if err != nil {
			return err
		}
		return printPage(out, res.GetEntries(), "")
	case "inbox show":
		if id <= 0 {
			return fmt.Errorf("%w: inbox show: --id is required", ErrUsage)
		}
		res, err := ops.GetInboxEntry(ctx, &opsv1.GetInboxEntryRequest{Id: id})
		if err != nil {
			return err
		}
		return printPage(out, []*opsv1.InboxEntry{res.GetEntry()}, "")
	case "inbox replay":
		req := &opsv1.ReplayInboxEntriesRequest{Authorization: authz, Reason: reason, DryRun: dryRun}
		var err error
		if req.Ids, err = parseIDs(cmd, ids); err != nil {
			return err
		}
		if req.FromTime, err = parseTime(cmd, from); err != nil {
			return err
		}
		if req.ToTime, err = parseTime(cmd, to); err != nil {
			return err
		}
		res, err := ops.ReplayInboxEntries(ctx, req)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d parked entries: %v\n", verb(res.GetDryRun(), "would reopen", "reopened"), len(res.GetIds()), res.GetIds())
		return err
	case "inbox cleanup":
		res, err := ops.CleanupInbox(ctx, &opsv1.CleanupInboxRequest{Authorization: authz, RetentionHours: int32(retentionHours), DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d resolved inbox entries\n", verb(res.GetDryRun(), "would delete", "deleted"), res.GetDeleted())
		return err
	case "jobs list":
		res, err := ops.ListJobs(ctx, &opsv1.ListJobsRequest{State: strings.ToLower(state), UniqueKey: uniqueKey,
			PageSize: int32(limit), PageToken: pageToken})
		if err != nil {
			return err
		}
		return printPage(out, res.GetJobs(), res.GetNextPageToken())
	case "jobs retry":
		jobIDs, err := parseIDs(cmd, ids)
		if err != nil {
			return err
		}
		if len(jobIDs) == 0 {
			return fmt.Errorf("%w: jobs retry: --ids is required", ErrUsage)
		}
		res, err := ops.RetryJobs(ctx, &opsv1.RetryJobsRequest{Authorization: authz, Ids: jobIDs, DryRun: dryRun})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d dead jobs: %v\n", verb(res.GetDryRun(), "would requeue", "requeued"), len(res.GetIds()), res.GetIds())
		return err
	default: // audit list
		res, err := ops.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{Action: action, Actor: auditActor, Ticket: auditTicket,
			PageSize: int32(limit), PageToken: pageToken})
		if err != nil {
			return err
		}
		return printPage(out, res.GetRecords(), res.GetNextPageToken())
	}
}

// printPage prints one JSON object per message (proto field names, compact)
// and, when another page follows, {"next_page_token": ...} last.
func printPage[M proto.Message](out io.Writer, ms []M, next string) error {
	opts := protojson.MarshalOptions{UseProtoNames: true}
	for _, m := range ms {
		b, err := opts.Marshal(m)
		if err != nil {
			return err
		}
		// protojson's spacing is deliberately unstable; compact it.
		var line bytes.Buffer
		if err := json.Compact(&line, b); err != nil {
			return err
		}
		line.WriteByte('\n')
		if _, err := out.Write(line.Bytes()); err != nil {
			return err
		}
	}
	if next != "" {
		return json.NewEncoder(out).Encode(map[string]string{"next_page_token": next})
	}
	return nil
}

func split(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

func parseIDs(cmd, s string) ([]int64, error) {
	var out []int64
	for _, part := range split(s) {
		n, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: --ids: %q is not an id", ErrUsage, cmd, part)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseTime reads an RFC 3339 time; empty is nil.
func parseTime(cmd, s string) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %q is not an RFC 3339 time", ErrUsage, cmd, s)
	}
	return timestamppb.New(t), nil
}

func verb(dry bool, would, did string) string {
	if dry {
		return "dry run: " + would
	}
	return did
}
