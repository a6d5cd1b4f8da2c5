// Package idempotency makes a mutating API call safe to retry: a client sends
// an idempotency key with the request (HTTP `Idempotency-Key`, IETF httpapi
// draft; gRPC metadata `idempotency-key`), and a retry with the same key gets
// the original response instead of a second effect.
//
// Lesson: a client cannot know whether a call that timed out took effect, so
// the server must make the retry harmless; recording the key in the business
// transaction makes "this key's effect" and "the effect" commit or vanish
// together. Guards F15's client side (a create that met an outage is retried
// with the same key and creates exactly one order), F3 (a rolled-back create
// leaves no key behind) and H7 (a malformed key is refused, ParseKey).
//
// Next hop: pkg/outbox, whose Append writes the order's hand-off event in the
// same transaction as the key.
//
// # Guarantees
//
// The key is recorded in the SAME database transaction as the business write
// it protects: Do takes the caller's pgx.Tx, never a pool. A crash can
// therefore never leave a key without its effect, nor an effect without its
// key; a request that fails rolls its key back and may simply be retried.
// Do costs two round trips; a caller that pipelines its transaction
// (a pgdb.Tx) splits it into Store.QueueClaim, sent with its BEGIN, and
// Finish, whose stored response travels with its COMMIT.
// Rules, per (scope, principal, key):
//
//   - first request: fn runs, its response is stored with the request hash;
//   - same key, same request (hash): the stored response is returned, fn does
//     not run (replayed = true);
//   - same key, different request: ErrMismatch (HTTP 422 in the draft);
//   - same key while the first request's transaction is still open:
//     ErrInFlight (HTTP 409), immediately, instead of queueing behind it;
//   - after Config.Retention the key is forgotten and a reuse is a new request.
//
// The request hash is SHA-256 of the request message's deterministic protobuf
// encoding (RequestHash); the scope names the operation and the principal
// the authenticated caller (Request.Principal), so two callers never share
// a key space: neither can replay, probe (a 422 would tell the key exists)
// or take the other's key.
// StatusError maps the errors to gRPC statuses (INVALID_ARGUMENT,
// FAILED_PRECONDITION IDEMPOTENCY_KEY_MISMATCH, ABORTED
// IDEMPOTENCY_KEY_IN_FLIGHT); KeyFromIncomingContext and ParseKey read and
// validate the key.
//
// This is API idempotency: one client retrying one call. It is NOT consumer
// idempotency (deduplicating messages by event id), which an inbox or an
// idempotent consumer implements.
//
// # Table
//
// {schema}.idempotency_keys: one row per (scope, principal, key) with the request hash,
// the encoded response (NULL only inside the claiming transaction), and the
// expiry. Expired rows are deleted in small batches by Store.Cleanup, which
// Store.RunCleanup runs every Config.CleanupInterval (run it in one or more
// replicas: concurrent cleaners split the work).
//
// # Applying the schema
//
// The package ships its migrations (migrations/*.sql, goose format, with the
// placeholder {schema}). Apply them before the service's own:
//
//	pgmigrate.Apply(ctx, db, idempotency.Migrations("api"), serviceSet)
//
// Their versions are tracked in
// {schema}.idempotency_schema_version. The schema defaults to DefaultSchema
// ("public"); to keep the table elsewhere, or to run two stores in one
// database, pass the same name to Migrations and, through WithSchema, to
// NewStore. Every query is qualified with it. The schema is an Option, not a
// Config field: it is wiring that must match the migrations the service
// applied, not a tunable read from the environment.
//
// # Configuration
//
// Config: Retention (default 24h: how long a retry is recognised),
// CleanupInterval (5m) and CleanupBatch (1000); each field documents its
// reason.
//
// # Metrics
//
// Counters, attribute scope: idempotency.replays (stored responses
// returned), idempotency.mismatches (keys reused with a different request: a
// client bug), idempotency.in_flight_conflicts (a retry while the first
// request is still running: clients retrying too fast); and
// idempotency.keys_deleted (cleanup).
//
// # Operator operations
//
// None are needed: keys expire on their own. To make a client's key usable
// again before its expiry, delete its row (scope, key); this turns the next
// request with that key into a new request, so do it only when the first
// one's effect is known.
//
// See docs/adr/0003-api-idempotency-keys.md for the design and the
// alternatives rejected.
package idempotency
