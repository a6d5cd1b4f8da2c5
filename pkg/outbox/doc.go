// Package outbox is a transactional outbox on PostgreSQL. A service writes
// the events of a business change in the transaction that makes the change
// (Append), and a Relay delivers them afterwards, each to the Dispatcher of
// its event type (a gRPC call, a Pub/Sub publish: see pkg/outboxpubsub).
// Nothing is sent from inside the business transaction, so there is no dual
// write to lose or invent a message.
//
// Lesson: a service cannot commit its database and call another system
// atomically, so it commits the message with the change and sends it after
// the commit, at least once, under an id that lets the receiver drop the
// copies. Guards F1 (a crash before the dispatch: the event is sent after the
// restart), F2 (a crash after it: sent again with the same id), F3 (a
// rollback leaves no event), F15 and F16 (the database or the destination
// down: backoff, or a circuit that charges no attempts), H9 (a dispatch that
// kills its relay ends FAILED) and H10 (a slow-mode dispatch that outlives
// its lease is redone and its stale outcome discarded); and the invariants I1
// (outbox atomicity), I4 (per-aggregate order) and I7 (the oldest pending
// age).
//
// Next hop: the hand-off's dispatcher calls the provider, whose completion
// comes back through Pub/Sub into pkg/inbox; events for Pub/Sub leave
// through pkg/outboxpubsub.
//
// # Reading the code
//
// Start with relay.go: the claim → dispatch → settle loop, one batch per
// turn (Relay.ProcessBatch). Each step it names is a file of its own:
//
//   - lockclaim.go: the lock claim, a batch locked in a transaction held
//     across its dispatch;
//   - lease.go: the lease claim of slow types, a committed lease and a
//     settlement per event (WithSlowDispatch);
//   - journal.go: the dispatch journal, which charges a crash to the event
//     whose dispatch killed the process;
//   - dispatch.go: the Dispatcher, and a batch's dispatch (aggregates in
//     parallel, each in order);
//   - circuit.go: the Circuit of each dependency;
//   - settle.go: the outcomes recorded, sent with the COMMIT;
//   - claimtx.go: the transactions whose BEGIN and COMMIT ride the batches
//     of statements (one round trip saved at each end);
//   - wake.go, maintain.go, metrics.go: NOTIFY wake-ups, gauges and
//     cleanup, instruments;
//   - event.go (Append), queries.go (the SQL and why each statement is
//     shaped so), config.go, options.go; requeue.go and inspect.go for
//     operators.
//
// # Guarantees
//
//   - Atomicity: an event exists if and only if the transaction that
//     appended it commits.
//   - At-least-once delivery: every committed event is dispatched until its
//     Dispatcher returns nil, or it is moved to FAILED, where it waits for an
//     operator: a permanent error (retry.Permanent), no dispatcher for its
//     type, or Config.MaxAttempts reached. A transient error is retried with
//     jittered exponential backoff.
//   - Duplicates are possible: a relay that dies after a dispatch and before
//     recording it, or whose record fails, leaves the event to be dispatched
//     again. Event.ID is the message id downstream; consumers deduplicate on
//     it.
//   - Per-aggregate order: events with one AggregateID are dispatched in the
//     order they were appended, across any number of relays. A later event
//     waits while an earlier one of its aggregate is still undelivered:
//     pending, in another relay's batch, backing off, or FAILED (until an
//     operator requeues it). Events of different aggregates are not ordered.
//   - Crashes: a relay claims a batch by locking its rows in one transaction
//     that it holds across the dispatch and that records the outcome. A relay
//     that dies loses that transaction and its rows are claimable again at
//     once, with nothing to undo; one that hangs or is cut off without
//     closing its connection loses them after Config.LeaseDuration (the
//     server's idle_in_transaction_session_timeout). An event whose dispatch
//     kills the relay process is charged an attempt through the dispatch
//     journal, so it ends in FAILED at MaxAttempts instead of killing relays
//     forever.
//   - A destination that is down (the Dispatcher returns Unavailable) costs
//     its events nothing: a Circuit per dependency stops dispatching to it,
//     probes it, and resumes as soon as it answers.
//
// # Tables
//
// migrations/00001_outbox.sql creates, in the configured schema:
//
//   - outbox: undelivered events, PENDING or FAILED, with attempts,
//     last_error and next_attempt_at (the backoff). Relays claim from it.
//   - outbox_published: delivered events, moved there by the transaction
//     that records the dispatch and kept for Config.Retention (diagnosis,
//     replay), then deleted by the relay.
//   - outbox_events: a view of both with a status (PENDING, FAILED,
//     PUBLISHED), for operators and tests.
//   - outbox_dispatching: the dispatch journal (UNLOGGED), which charges a
//     crash to the event being dispatched.
//   - no trigger: Append notifies the channel "<schema>.outbox" with the
//     lowest id it inserted (pgnotify.Notify), after the commit when the
//     writer's transaction is a pgdb.Tx (pgdb.InTx), else
//     at the commit. Relays LISTEN on it and also poll
//     (Config.PollInterval), so a lost notification, or a row inserted by
//     other means, costs latency, never an event. (Migration 00002 dropped
//     the insert trigger of 00001: a NOTIFY inside the business transaction
//     holds PostgreSQL's global notification lock across its commit's
//     flush, and serialised every notifying commit of the server; ADR 0002.)
//
// A FAILED event goes back to the relay when an operator requeues it: a
// Requeuer (NewRequeuer) sets it PENDING again with a fresh attempt budget
// and the operator's note in front of its last_error, at most
// MaxRequeueEvents per call, with a dry run, and wakes the relays; see
// docs/runbooks/outbox-relay-stalled.md. An Inspector (NewInspector) lists
// events for an operator's console, by state, aggregate and type, in claim
// order, paged; it only reads.
//
// # Schema
//
// The package owns its tables. List Migrations(schema) among a service's migration sets for
// pgmigrate.Apply, before the service's own set (a service table may
// reference the outbox; the outbox references nothing of the service). Its
// versions are tracked in <schema>.outbox_schema_version. The schema
// defaults to DefaultSchema ("public"); to keep the tables elsewhere, or to
// run two outboxes in one database, pass the same name to Migrations and,
// through WithSchema, to every constructor (NewRelay, NewWriter; the
// package-level Append writes to DefaultSchema). The schema is an Option,
// not a Config field: it is wiring that must match the migrations the
// service applied, not a tunable read from the environment. Every statement
// names its tables with the schema, rendered once at construction, so the
// session's search_path does not matter, and each schema's outbox notifies
// its own channel.
//
// # Use
//
// In the business transaction:
//
//	ev, err := outbox.NewEvent(ctx, "work_order", id, &eventsv1.WorkOrderCreated{...})
//	...
//	err = outbox.Append(ctx, tx, ev) // or w.Append, w from outbox.NewWriter(outbox.WithSchema(name))
//
// Writer.AppendWith sends the insert with the business change's own
// statements (a pgx.Batch), in one round trip.
//
// In each replica, one relay:
//
//	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{ev.Type: d}, cfg, logger, meter)
//	...
//	go relay.Run(ctx) // until ctx is cancelled
//
// A Dispatcher returns nil once the destination has accepted the event,
// optionally with a Commit that runs in the transaction recording the event
// as published (to move a business row along with it).
//
// Event types whose dispatcher waits on a slow destination (hundreds of
// milliseconds, sometimes a deadline) go in slow mode with
// WithSlowDispatch: their rows are claimed with a committed lease instead of
// the locks of a transaction held across the dispatch, each event is
// settled on its own as soon as it is dispatched, and up to
// Config.SlowDispatchConcurrency of them are in flight (lease.go). Every
// relay on one outbox must name the same slow types.
//
// # Configuration
//
// Config holds the tunables; each field documents its default and the reason
// for it, and the zero value means the default. The services read them
// from environment variables under a prefix. A relay holds one connection of
// its pool per batch in flight (Config.BatchesInFlight, default 2), and opens
// beside the pool one connection for LISTEN and up to BatchesInFlight for the
// dispatch journal.
//
// # Metrics
//
// With a non-nil metric.Meter, the relay reports:
//
//   - outbox.events.dispatched (counter, by event_type)
//   - outbox.dispatch.errors (counter, by event_type and error.kind:
//     transient, permanent, unavailable)
//   - outbox.events.moved_to_failed (counter, by event_type)
//   - outbox.events.unsettled (counter): dispatched events whose batch could
//     not be recorded, which will be dispatched again
//   - outbox.events.pending, outbox.events.failed (gauges, capped by
//     Config.StatsCountLimit) and outbox.events.oldest_pending_age (gauge, s),
//     refreshed every Config.StatsInterval: the age is the alarm that a relay
//     is stalled
//   - outbox.circuit.state (gauge: 0 closed, 1 half-open, 2 open) and
//     outbox.circuit.transitions (counter), by dependency.
//
// # Design
//
// docs/adr/0001-delivery-semantics.md explains why delivery is at least once
// with idempotent consumers; docs/adr/0002-outbox-polling-vs-cdc.md explains
// the relay: polling with a keyset claim, row locks held across the
// dispatch, the sweep and the NOTIFY rewind behind the cursor, the journal,
// and the measurements behind the defaults.
package outbox
