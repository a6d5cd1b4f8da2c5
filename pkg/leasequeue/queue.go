package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Queue is one named queue in the leasequeue_jobs table: the fenced
// primitives every worker uses (lease.go), and the operator operations
// (ops.go).
type Queue struct {
	pool    *pgxpool.Pool // a pool, not a pgdb.DB: each worker acquires a dedicated connection to LISTEN on
	cfg     Config
	schema  string  // WithSchema
	sql     queries // rendered for schema
	channel string  // NOTIFY channel
	logger  *slog.Logger
	tracer  trace.Tracer
	m       *metrics
	stats   atomic.Pointer[Stats] // last RunStats refresh; nil before the first
	clock   func() time.Time
}

// Option is optional behaviour of a Queue, given to New. (NewWorker takes
// the Queue, and works in its schema.)
type Option func(*Queue)

// WithSchema names the PostgreSQL schema holding the package's tables, the
// one Migrations was applied to. Default DefaultSchema ("public"); a service
// that keeps pattern tables apart from its own passes e.g. "leasequeue".
// Every statement names its tables qualified by it, and the queue's NOTIFY
// channel includes it outside the default schema, so same-named queues of
// two schemas neither see nor wake each other. It is an option, not a Config
// field: it is wiring that must match the migrations the service applied,
// not a tunable to read from the environment.
func WithSchema(name string) Option {
	return func(q *Queue) { q.schema = name }
}

// WithClock sets the clock used for every lease and due time the queue
// writes (default time.Now; nil keeps it). Tests inject a fake clock to
// expire leases without sleeping. All replicas must agree on time within a
// small fraction of LeaseDuration (NTP); the fencing token keeps writes safe
// regardless.
func WithClock(now func() time.Time) Option {
	return func(q *Queue) {
		if now != nil {
			q.clock = now
		}
	}
}

// WithTracerProvider traces the queue's workers: each attempt of a job is a
// span, a new trace linked to the span that enqueued the job (NewJob's
// Traceparent). Without it nothing is traced.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(q *Queue) {
		if tp != nil {
			q.tracer = tp.Tracer("github.com/lossless-dev/lossless/pkg/leasequeue")
		}
	}
}

// New returns the queue cfg.Name on pool, in the schema named by WithSchema
// (default DefaultSchema). It needs a pool, not a single connection: workers
// hold one connection each for LISTEN and run claims, heartbeats and
// completions concurrently. meter may be nil (no metrics).
func New(pool *pgxpool.Pool, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Queue, error) {
	if pool == nil {
		return nil, errors.New("leasequeue: nil pool")
	}
	if logger == nil {
		return nil, errors.New("leasequeue: nil logger")
	}
	meter = telemetry.MeterOrNoop(meter)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("leasequeue: config: %w", err)
	}
	q := &Queue{
		clock:  time.Now,
		pool:   pool,
		cfg:    cfg,
		logger: logger.With("queue", cfg.Name),
		tracer: tracenoop.NewTracerProvider().Tracer(""),
	}
	for _, o := range opts {
		o(q)
	}
	q.schema = pgmigrate.SchemaOrDefault(q.schema)
	if err := pgmigrate.ValidateSchema(q.schema); err != nil {
		return nil, fmt.Errorf("leasequeue: WithSchema: %w", err)
	}
	q.sql = renderQueries(q.schema)
	q.channel = notifyChannel(q.schema, cfg.Name)
	m, err := newMetrics(meter, q)
	if err != nil {
		return nil, err
	}
	q.m = m
	return q, nil
}

// RunStats refreshes the gauges every StatsInterval until ctx is cancelled.
// Run it once per process (the counts are the table's, so every replica
// reports the same values).
func (q *Queue) RunStats(ctx context.Context) error {
	t := time.NewTicker(q.cfg.StatsInterval)
	defer t.Stop()
	for {
		if err := q.RefreshStats(ctx); err != nil && ctx.Err() == nil {
			q.logger.WarnContext(ctx, "queue stats refresh failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RefreshStats runs the stats query once and publishes it to the gauges.
func (q *Queue) RefreshStats(ctx context.Context) error {
	s, err := q.Stats(ctx, q.pool)
	if err != nil {
		return err
	}
	q.stats.Store(&s)
	return nil
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.cfg.Name }

// LeaseDuration returns the configured lease.
func (q *Queue) LeaseDuration() time.Duration { return q.cfg.LeaseDuration }

func (q *Queue) now() time.Time { return q.clock() }

// notifyChannel is the LISTEN/NOTIFY channel of a queue:
// "leasequeue_<name>", with "<schema>_" before the name outside the default
// schema so that same-named queues of two schemas do not wake each other. It
// is an identifier, so it is folded to lower case letters, digits and '_',
// and a name beyond PostgreSQL's 63 bytes (pg_notify refuses it) is cut and
// suffixed with a hash of the whole, keeping distinct queues apart.
func notifyChannel(schema, name string) string {
	ch := "leasequeue_"
	if schema != DefaultSchema {
		ch += schema + "_"
	}
	ch += strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '_'
	}, name)
	if len(ch) <= maxIdentifier {
		return ch
	}
	h := fnv.New32a()
	h.Write([]byte(schema + "." + name))
	return fmt.Sprintf("%s_%08x", ch[:maxIdentifier-9], h.Sum32())
}

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN-1).
const maxIdentifier = 63

// Enqueue inserts jobs through db, normally the caller's business transaction
// (the job exists if and only if the transaction commits). A job whose
// UniqueKey already exists in the queue is skipped. It returns how many jobs
// were inserted. New jobs wake idle workers (pgnotify.Notify): through a
// transaction at its commit, after it if the transaction is a pgdb.Tx;
// through a pool at once.
func (q *Queue) Enqueue(ctx context.Context, db pgdb.Executor, jobs ...NewJob) (int, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	now := q.now()
	keys := make([]*string, len(jobs))
	payloads := make([][]byte, len(jobs))
	maxes := make([]int32, len(jobs))
	dues := make([]time.Time, len(jobs))
	parents := make([]string, len(jobs))
	states := make([]string, len(jobs))
	for i, j := range jobs {
		parents[i], states[i] = j.Traceparent, j.Tracestate
		if j.UniqueKey != "" {
			k := j.UniqueKey
			keys[i] = &k
		}
		payloads[i] = j.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		maxes[i] = int32(DefaultMaxAttempts)
		if j.MaxAttempts > 0 {
			maxes[i] = int32(min(j.MaxAttempts, 1000))
		}
		dues[i] = now
		if !j.RunAt.IsZero() {
			dues[i] = j.RunAt
		}
	}
	var n int64
	if err := db.QueryRow(ctx, q.sql.enqueue, q.cfg.Name, keys, payloads, maxes, dues, parents, states).Scan(&n); err != nil {
		return 0, fmt.Errorf("leasequeue: enqueue: %w", err)
	}
	q.m.enqueued.Add(ctx, n, q.m.attrs)
	if n > 0 {
		if err := pgnotify.Notify(ctx, db, pgnotify.Notification{Channel: q.channel}); err != nil {
			if _, inTx := db.(pgx.Tx); inTx {
				return 0, fmt.Errorf("leasequeue: enqueue: %w", err)
			}
			// Committed already: idle workers find the jobs by polling.
			q.logger.WarnContext(ctx, "leasequeue: jobs enqueued, but waking the workers failed; they find them by polling", "error", err)
		}
	}
	return int(n), nil
}

// truncate cuts s to at most n bytes on a rune boundary: a cut inside a
// multi-byte character would be invalid UTF-8, which PostgreSQL rejects,
// failing the statement that records a whole batch of failed attempts.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
