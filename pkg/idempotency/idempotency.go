package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

var (
	// ErrMismatch: the key was already used with a different request.
	ErrMismatch = errors.New("idempotency key reused with a different request")
	// ErrInFlight: another transaction holding the same key has not finished.
	ErrInFlight = errors.New("a request with this idempotency key is still being processed")
)

// Config of a Store: its tunables. Zero fields take their defaults (NewStore
// applies them). The schema of the table is not a tunable but wiring, chosen
// with WithSchema.
type Config struct {
	// Retention is how long a key is remembered after its first use. Default
	// 24h: clients retry within seconds to minutes (a mobile client may come
	// back after a night offline at most); Stripe, the draft's main precedent,
	// also keeps keys 24 h. Longer costs rows, shorter turns a late retry into a
	// second order.
	Retention time.Duration
	// CleanupInterval is the pause between two cleanup passes of RunCleanup.
	// Default 5m.
	CleanupInterval time.Duration
	// CleanupBatch is the number of rows one DELETE removes, so a cleanup
	// never holds many row locks or generates one huge WAL burst. Default 1000.
	CleanupBatch int
}

func (c *Config) setDefaults() {
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = 5 * time.Minute
	}
	if c.CleanupBatch == 0 {
		c.CleanupBatch = 1000
	}
}

// Validate reports settings that cannot work. Zero values are valid (they
// mean the defaults); negative ones are not.
func (c Config) Validate() error {
	var errs []error
	if c.Retention != 0 && c.Retention < time.Second {
		errs = append(errs, fmt.Errorf("Config.Retention %v: must be at least 1s", c.Retention))
	}
	if c.CleanupInterval < 0 {
		errs = append(errs, fmt.Errorf("Config.CleanupInterval %v: must not be negative", c.CleanupInterval))
	}
	if c.CleanupBatch < 0 {
		errs = append(errs, fmt.Errorf("Config.CleanupBatch %d: must not be negative", c.CleanupBatch))
	}
	return errors.Join(errs...)
}

// Store records idempotency keys in the idempotency_keys table.
type Store struct {
	db          pgdb.Executor // Cleanup only; Do works in the caller's transaction
	cfg         Config
	schema      string  // WithSchema
	sql         queries // rendered for schema
	log         *slog.Logger
	replays     metric.Int64Counter
	mismatches  metric.Int64Counter
	conflicts   metric.Int64Counter
	keysDeleted metric.Int64Counter
}

// Option is optional behaviour of a Store, given to NewStore.
type Option func(*options)

type options struct{ schema string }

// WithSchema names the PostgreSQL schema holding idempotency_keys, the one
// Migrations was applied to. Default DefaultSchema ("public"). Every
// statement names the table qualified by it, and it is part of each key's
// advisory lock, so two stores in two schemas of one database do not take
// each other's locks. It is an option, not a Config field: it is wiring that
// must match the migrations the service applied, not a tunable to read from
// the environment.
func WithSchema(name string) Option {
	return func(o *options) { o.schema = name }
}

// NewStore returns a Store on the table in the schema named by WithSchema
// (default DefaultSchema). db is used only by Cleanup (normally a pool); Do
// works in the caller's transaction. A nil meter disables metrics.
func NewStore(db pgdb.Executor, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("idempotency: db is nil")
	}
	if logger == nil {
		return nil, errors.New("idempotency: logger is nil")
	}
	meter = telemetry.MeterOrNoop(meter)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("idempotency: config: %w", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	schema := pgmigrate.SchemaOrDefault(o.schema)
	if err := pgmigrate.ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("idempotency: WithSchema: %w", err)
	}
	s := &Store{db: db, cfg: cfg, schema: schema, sql: renderQueries(schema), log: logger}
	var errs [4]error
	s.replays, errs[0] = meter.Int64Counter("idempotency.replays",
		metric.WithDescription("Requests answered with the stored response of an earlier request with the same key."))
	s.mismatches, errs[1] = meter.Int64Counter("idempotency.mismatches",
		metric.WithDescription("Requests refused because their key was used with a different request."))
	s.conflicts, errs[2] = meter.Int64Counter("idempotency.in_flight_conflicts",
		metric.WithDescription("Requests refused because the first request with their key was still in flight."))
	s.keysDeleted, errs[3] = meter.Int64Counter("idempotency.keys_deleted",
		metric.WithDescription("Expired idempotency keys removed by the cleanup."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("idempotency: metrics: %w", err)
	}
	return s, nil
}

// Config returns the store's effective configuration (defaults applied).
func (s *Store) Config() Config { return s.cfg }

// Request identifies one idempotent call.
type Request struct {
	// Scope is the operation, e.g. the gRPC full method name.
	Scope string
	// Principal is the authenticated caller (e.g. its token's subject), so
	// two callers using the same key get two effects and never see, probe
	// or take each other's key. "" only where there is no authentication:
	// then every caller shares one key space. At most 255 bytes.
	Principal string
	// Key is the client's idempotency key (see ParseKey).
	Key string
	// Hash is the request's fingerprint (see RequestHash).
	Hash []byte
}

// NewRequest builds a Request, hashing msg.
func NewRequest(scope, key string, msg proto.Message) (Request, error) {
	h, err := RequestHash(msg)
	if err != nil {
		return Request{}, err
	}
	return Request{Scope: scope, Key: key, Hash: h}, nil
}

func (r Request) validate() error {
	if r.Scope == "" {
		return errors.New("idempotency: empty scope")
	}
	if len(r.Principal) > maxPrincipalBytes {
		return fmt.Errorf("idempotency: principal has %d bytes, at most %d", len(r.Principal), maxPrincipalBytes)
	}
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if len(r.Hash) != sha256.Size {
		return fmt.Errorf("idempotency: request hash has %d bytes, want %d", len(r.Hash), sha256.Size)
	}
	return nil
}

// RequestHash is the SHA-256 of msg's deterministic protobuf encoding. Field
// order and map order do not change it; an unset field and a field set to its
// proto3 default are the same request, as they are on the wire. Callers clear
// fields the server ignores (output-only fields) before hashing.
func RequestHash(msg proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("idempotency: encode request: %w", err)
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// maxPrincipalBytes bounds Request.Principal (the column's CHECK).
const maxPrincipalBytes = 255

// lockNamespace is the first key of the two-key advisory lock form, so our
// locks cannot collide with single-bigint advisory locks taken elsewhere in
// the same database. The value is arbitrary ("1de7" reads "idem").
const lockNamespace int32 = 0x1de7

// The statements name {schema}.idempotency_keys; NewStore renders them once
// with the schema of WithSchema.
const (
	// One statement takes the key's lock and claims the key.
	// pg_try_advisory_xact_lock returns at once: a second request with a key
	// whose transaction is still open is answered 409, rather than blocking on
	// the unique index until the first commits. The lock is released with the
	// transaction, never leaked. The insert takes its row from the lock's CTE
	// (evaluated once: it is volatile), so it runs only once the lock is
	// held, and without it inserts nothing and waits on nothing.
	//
	// Insert-first, not check-then-act. A live row wins (DO UPDATE's WHERE is
	// false, RETURNING yields nothing); an expired row not yet cleaned up is
	// taken over, because after the retention the key is forgotten. Returns
	// (lock held, key claimed).
	claimSQL = `
WITH lock AS (SELECT pg_try_advisory_xact_lock($6::int4, $7::int4) AS held),
claimed AS (
    INSERT INTO {schema}.idempotency_keys AS k (scope, principal, key, request_hash, expires_at)
    SELECT $1, $5, $2, $3, now() + $4::bigint * interval '1 microsecond' FROM lock WHERE lock.held
    ON CONFLICT (scope, principal, key) DO UPDATE
        SET request_hash = EXCLUDED.request_hash,
            response     = NULL,
            created_at   = now(),
            expires_at   = EXCLUDED.expires_at
        WHERE k.expires_at <= now()
    RETURNING true)
SELECT lock.held, EXISTS (SELECT 1 FROM claimed) FROM lock`

	loadSQL = `SELECT request_hash, response FROM {schema}.idempotency_keys WHERE scope = $1 AND key = $2 AND principal = $3`

	completeSQL = `UPDATE {schema}.idempotency_keys SET response = $3 WHERE scope = $1 AND key = $2 AND principal = $4`
)

// queries are the statements rendered for one schema.
type queries struct{ claim, load, complete, cleanup string }

func renderQueries(schema string) queries {
	return queries{
		claim:    pgmigrate.Render(claimSQL, schema),
		load:     pgmigrate.Render(loadSQL, schema),
		complete: pgmigrate.Render(completeSQL, schema),
		cleanup:  pgmigrate.Render(cleanupSQL, schema),
	}
}

// Do runs fn at most once per (req.Scope, req.Principal, req.Key) within tx, the caller's
// business transaction, and returns fn's response, or the stored response of
// the first request with replayed = true. fn must do its writes in tx. When
// Do or fn returns an error the caller must roll tx back (which also forgets
// the key). Errors: ErrMismatch, ErrInFlight, a key validation error (see
// ValidateKey), fn's own error, or a database error. tx is a pgx.Tx, not a
// pgdb.Executor: the key's advisory lock lasts until tx ends.
func Do[R proto.Message](ctx context.Context, s *Store, tx pgx.Tx, req Request, fn func(ctx context.Context) (R, error)) (resp R, replayed bool, err error) {
	var zero R
	b := &pgx.Batch{}
	c, err := s.QueueClaim(b, req)
	if err != nil {
		return zero, false, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return zero, false, err
	}
	return Finish(ctx, c, tx, fn, nil)
}

// Claim is a key's claim queued in a batch (Store.QueueClaim), for a
// caller that counts its round trips: the batch that carries it can carry
// the transaction's BEGIN too (a pgdb.Tx). Finish completes it.
type Claim struct {
	s                     *Store
	req                   Request
	sent, locked, claimed bool
}

// QueueClaim queues in b the statement that takes req's key lock and claims
// the key, for the caller to send in its business transaction; then call
// Finish in the same transaction. It returns key validation errors.
func (s *Store) QueueClaim(b *pgx.Batch, req Request) (*Claim, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	c := &Claim{s: s, req: req}
	b.Queue(s.sql.claim, req.Scope, req.Key, req.Hash, s.cfg.Retention.Microseconds(), req.Principal,
		lockNamespace, lockKey(s.schema, req.Scope, req.Principal, req.Key)).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&c.locked, &c.claimed); err != nil {
			return fmt.Errorf("idempotency: claim key: %w", err)
		}
		c.sent = true
		return nil
	})
	return c, nil
}

// Finish is the rest of Do once c's batch has been sent in tx: fn runs when
// the claim won, and its response is stored with the key, in last when
// last is not nil (queued to travel with the COMMIT, pgdb.Tx.CommitWith:
// the caller must send last in tx before committing), else at once; a key
// already used is replayed or refused as Do does. Same errors as Do.
func Finish[R proto.Message](ctx context.Context, c *Claim, tx pgx.Tx, fn func(ctx context.Context) (R, error), last *pgx.Batch) (resp R, replayed bool, err error) {
	var zero R
	if !c.sent {
		return zero, false, errors.New("idempotency: Finish before the claim's batch was sent")
	}
	s, req := c.s, c.req
	attrs := metric.WithAttributes(attribute.String("scope", req.Scope))
	if !c.locked {
		s.conflicts.Add(ctx, 1, attrs)
		return zero, false, ErrInFlight
	}
	if c.claimed {
		resp, err := fn(ctx)
		if err != nil {
			return zero, false, err
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
		if err != nil {
			return zero, false, fmt.Errorf("idempotency: encode response: %w", err)
		}
		if last != nil {
			last.Queue(s.sql.complete, req.Scope, req.Key, b, req.Principal)
			return resp, false, nil
		}
		if _, err := tx.Exec(ctx, s.sql.complete, req.Scope, req.Key, b, req.Principal); err != nil {
			return zero, false, fmt.Errorf("idempotency: store response: %w", err)
		}
		return resp, false, nil
	}
	// A live key exists and, since we hold its lock, its transaction committed.

	var hash, stored []byte
	if err := tx.QueryRow(ctx, s.sql.load, req.Scope, req.Key, req.Principal).Scan(&hash, &stored); err != nil {
		return zero, false, fmt.Errorf("idempotency: load key: %w", err)
	}
	if !bytes.Equal(hash, req.Hash) {
		s.mismatches.Add(ctx, 1, attrs)
		return zero, false, ErrMismatch
	}
	if stored == nil {
		// Only possible if a caller committed after Do or fn failed.
		return zero, false, fmt.Errorf("idempotency: key %q in scope %q has no stored response", req.Key, req.Scope)
	}
	resp = zero.ProtoReflect().Type().New().Interface().(R)
	if err := proto.Unmarshal(stored, resp); err != nil {
		return zero, false, fmt.Errorf("idempotency: decode stored response: %w", err)
	}
	s.replays.Add(ctx, 1, attrs)
	return resp, true, nil
}

// lockKey folds (schema, scope, principal, key) into the advisory lock's 32-bit second
// key: advisory locks are per database, so two stores in different schemas
// must not share them. Two different keys that collide only make one of them
// see a spurious 409 while the other is in flight; correctness rests on the
// primary key, not the lock.
func lockKey(schema, scope, principal, key string) int32 {
	h := sha256.New()
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(principal))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int32(binary.BigEndian.Uint32(h.Sum(nil)))
}
