// Package consumer is the idempotent-consumer skeleton, written once: a
// service supplies a decoder and an apply function (Handler), and the
// skeleton decodes each message, claims its event id, applies it, parks
// what cannot be applied, and acks only after the commit.
//
// Lesson: an event's effect is applied at most once per consumer however
// often the broker delivers it, because a marker (consumer, event id) is
// inserted first, in the transaction that applies the effect, and the
// primary key arbitrates; and nothing received is ever dropped silently or
// retried forever, because a message that cannot be applied is parked with
// its raw bytes and the reason, in the same transaction as its batch-mates'
// effects.
//
// It guards F4 (the same event delivered twice, also concurrently: one
// effect), F10 (a crash or a lost ack between commit and ack: the
// redelivery finds the marker), F9 (a poison message: parked, acked, its
// batch-mates commit), the H-series of hostile input (H2 bytes the database
// refuses, H3 oversize payloads, H5 unknown event types: refused by the
// decoder or isolated when the database refuses them, and parked), and the
// invariants I2 (nothing lost on receipt: every message is applied,
// recognised as a duplicate, or parked) and, with the service's own unique
// keys, I3 (one invoice per work order).
//
// Next hop: pkg/leasequeue; billing's apply enqueues the invoice job in the
// consumer's transaction. (Workorder's invoicing runs the same skeleton on
// InvoiceIssued: the order becomes INVOICED, the end of its path.)
//
// # The path of a message
//
//	decode (Handler.Decode, pure) ─ refused ─────────────────────────────┐
//	   │ accepted                                                        │
//	savepoint: claim the marker (Markers.Claim)                          │
//	   │ duplicate → nothing applied         conflict (same id, other    │
//	   │ new                                 content: a producer bug) ──┤
//	Handler.Apply(ctx, tx, event) ─ permanent error, or pgdb.IsData ─────┤
//	   │ (the savepoint rolls back: effects and marker)                  │
//	commit with the batch ◄──────────────── park (pkg/parked), in the tx ┘
//	   │
//	ack
//
// Only an infrastructure failure nacks, so that the broker redelivers
// (F15). Replay sends a parked message through the same path once an
// operator fixed its cause, and records who replayed it under which ticket
// in the same transaction.
//
// # One transaction per batch, a savepoint per message
//
// The consumer handles a batch in one transaction with a savepoint per
// message, and falls back to one transaction per message when that
// transaction fails. Of the two strategies the services used before (one
// transaction per batch, isolating messages only on a data error; one
// transaction per message, four at once), this is the better one: a
// commit waits for the WAL to reach disk and a savepoint does not, so a
// batch of a hundred pays one flush instead of a hundred and needs no
// concurrency knob to keep up with the broker, while the savepoint still
// confines a refusal (the state the event finds rules it out, a rule the
// decoder does not know) to its own message: its effects and its marker
// roll back, it is parked, its batch-mates commit. The cost is locks held
// until the batch commits: two batches that lock the same rows in other
// orders can deadlock. PostgreSQL then aborts one of them, and the
// per-message fallback applies that batch's messages one transaction each
// (Config.Concurrency at once), so only a message that fails on its own
// nacks.
//
// The transaction is pipelined (docs/adr/0023): the BEGIN travels with the
// first message's savepoint and marker claim, each later message's
// savepoint and claim with the release of the previous one (at most one
// savepoint is open), and the COMMIT with the NOTIFYs Apply sent, which run
// after it (a pgdb.Tx). A message that writes one statement costs
// three round trips alone, two more in a batch.
//
// # Schema
//
// One table, {schema}.processed_events, shipped as an embedded goose
// migration: apply Migrations(schema) with pkg/pgmigrate (or call Migrate)
// before the service's own migrations, and parked_messages (pkg/parked)
// with it. The schema is fixed when a consumer, a Markers or a Cleaner is
// built (WithSchema), never per call.
//
// # Operations
//
// Run a Cleaner (one per database is enough; several are harmless): markers
// are deleted after CleanerConfig.Retention, which must exceed the longest
// time the broker may still deliver an event; a marker deleted earlier lets
// that redelivery apply twice. Parked messages are listed and replayed by
// operators (pkg/parked, Replay). See docs/adr/0007 for where this consumer
// sits next to the transactional inbox (pkg/inbox): the inbox stores before
// it applies, this consumer applies directly in its transaction.
package consumer
