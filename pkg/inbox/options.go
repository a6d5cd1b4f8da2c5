package inbox

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/pgschema"
)

// Option is optional behaviour, accepted by every constructor of the package
// (NewStore, NewRelay, NewOps, NewMonitor). A constructor
// ignores the options it has no use for, so one option list can configure
// all of them.
type Option func(*options)

type options struct {
	schema string
	tracer trace.TracerProvider
	audit  AuditFunc
}

// WithSchema names the PostgreSQL schema holding the package's tables, the
// one Migrations was applied to. Default DefaultSchema. Every query of the
// package names its objects qualified by it, and the relay listens on
// NotifyChannel(schema), so two inboxes in two schemas of one database
// neither see nor wake each other.
func WithSchema(name string) Option {
	return func(o *options) { o.schema = name }
}

// WithTracerProvider traces the relay: each claimed batch is applied under
// one span, a new trace linked to the span that stored each entry (its
// traceparent column). What the handler writes in it (an outbox row) carries
// that span's context onward. Without it nothing is traced.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

// WithAudit replaces where Ops records its operator actions: f is called
// inside the transaction of each action, instead of inserting into the
// package's {schema}.inbox_audit table. A service that keeps one audit log
// for all its privileged actions passes a function writing to it.
func WithAudit(f AuditFunc) Option {
	return func(o *options) { o.audit = f }
}

func newOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	o.schema = pgschema.OrDefault(o.schema)
	if err := pgschema.Validate(o.schema); err != nil {
		return options{}, fmt.Errorf("inbox: %w", err)
	}
	return o, nil
}

// maxChannelLength is PostgreSQL's limit on a NOTIFY channel name
// (NAMEDATALEN-1 bytes); pg_notify fails on a longer one.
const maxChannelLength = 63

// NotifyChannel is the channel Store.Ingest and Store.MakeDue of schema notify
// and the relay listens on: "<schema>.inbox", cut to PostgreSQL's 63 bytes. Two schemas whose names share their first
// 57 bytes share a channel; that costs a spurious wake-up, nothing else.
func NotifyChannel(schema string) string {
	c := pgschema.OrDefault(schema) + ".inbox"
	if len(c) > maxChannelLength {
		c = c[:maxChannelLength]
	}
	return c
}

// queries are the package's statements rendered for one schema, once per
// constructor call.
type queries struct {
	insertBatch, recordConflicts                              string
	claimDue, resolveBatch, lockUnchanged                     string
	getEntry, listEntries, listByEvent, selectReplay, reopen  string
	insertAudit                                               string
	deleteResolved, countResolved                             string
	oldestOpenAge, parkedByReason, openConflicts, openEntries string
	makeDue                                                   string
	channel                                                   string
}

func newQueries(schema string) queries {
	r := func(q string) string { return pgschema.Render(q, schema) }
	return queries{
		insertBatch:     r(insertBatch),
		recordConflicts: r(recordConflicts),
		claimDue:        r(claimDue),
		resolveBatch:    r(resolveBatch),
		lockUnchanged:   r(lockUnchanged),
		getEntry:        r(getEntry),
		listEntries:     r(listEntries),
		listByEvent:     r(listByEvent),
		selectReplay:    r(selectReplay),
		reopen:          r(reopen),
		insertAudit:     r(insertAudit),
		deleteResolved:  r(deleteResolved),
		countResolved:   r(countResolved),
		oldestOpenAge:   r(oldestOpenAge),
		parkedByReason:  r(parkedByReason),
		openConflicts:   r(openConflicts),
		openEntries:     r(openEntries),
		makeDue:         r(qMakeDue),
		channel:         NotifyChannel(schema),
	}
}
