package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// Config of a Queue: its tunables. Zero fields take their defaults. The
// schema of the tables is not a tunable but wiring, chosen with WithSchema.
type Config struct {
	// Name of the queue (leasequeue_jobs.queue): several queues share the
	// table. Required; 1-60 of letters, digits, '.', '_', '-'.
	Name string
	// StatsInterval is how often RunStats refreshes the queue's gauges (jobs
	// by state, expired leases, oldest available age) with one bounded
	// query. Default 15s (a typical scrape interval); scrapes never query.
	StatsInterval time.Duration
	// LeaseDuration is how long a claim holds a job without a heartbeat. It
	// bounds how long a dead worker's job waits before another worker takes it
	// over (plus the Worker's RescueInterval). Default 30s.
	LeaseDuration time.Duration
	// Backoff spaces the retries of failed attempts. Default {Base: 1s, Max:
	// 5m}, full jitter: with DefaultMaxAttempts about half an hour of retries,
	// enough to outlast a database failover or a deploy.
	Backoff retry.Backoff
}

var queueName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,60}$`)

func (c *Config) setDefaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 30 * time.Second
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = 15 * time.Second
	}
	if c.Backoff.Base == 0 {
		c.Backoff.Base = time.Second
	}
	if c.Backoff.Max == 0 {
		c.Backoff.Max = 5 * time.Minute
	}
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	var errs []error
	if !queueName.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("Name %q: want 1-60 of [A-Za-z0-9._-]", c.Name))
	}
	if c.LeaseDuration < 0 || (c.LeaseDuration > 0 && c.LeaseDuration < 10*time.Millisecond) {
		errs = append(errs, fmt.Errorf("LeaseDuration %v: want at least 10ms", c.LeaseDuration))
	}
	if c.StatsInterval < 0 {
		errs = append(errs, fmt.Errorf("StatsInterval %v: want >= 0", c.StatsInterval))
	}
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Config.Backoff: %w", err))
	}
	return errors.Join(errs...)
}

// Queue is one named queue in the leasequeue_jobs table: the fenced
// primitives every worker uses, and the operator operations.
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
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
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

// Claim takes up to limit available jobs for owner, under a new lease and a
// new fencing token each. cursor is the keyset position (0 scans from the
// start); see qClaimAvailable.
func (q *Queue) Claim(ctx context.Context, owner string, limit int, cursor int64) ([]Job, error) {
	now := q.now()
	jobs, err := q.claim(ctx, q.sql.claimAvailable, owner, q.cfg.Name, cursor, now, limit, owner, now.Add(q.cfg.LeaseDuration))
	if err != nil {
		return nil, err
	}
	q.m.claimed.Add(ctx, int64(len(jobs)), q.m.attrsFresh)
	return jobs, nil
}

// ClaimExpired takes up to limit jobs whose lease expired (their owner is
// presumed dead), and parks the ones that expired on their last attempt.
// Both statements go in one batch (one round trip), i.e. one implicit
// transaction: if either fails neither is applied, and the next rescue
// tries again.
func (q *Queue) ClaimExpired(ctx context.Context, owner string, limit int) ([]Job, error) {
	now := q.now()
	b := &pgx.Batch{}
	b.Queue(q.sql.buryExpired, q.cfg.Name, now)
	b.Queue(q.sql.claimExpired, q.cfg.Name, now, limit, owner, now.Add(q.cfg.LeaseDuration))
	br := q.pool.SendBatch(ctx, b)
	var buried []int64
	var jobs []Job
	rows, err := br.Query()
	if err == nil {
		buried, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err == nil {
		if rows, err = br.Query(); err == nil {
			jobs, err = collectJobs(rows, owner)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("leasequeue: rescue expired leases: %w", err)
	}
	for _, id := range buried {
		q.m.dead.Add(ctx, 1, q.m.attrs)
		q.logger.Error("job parked: lease expired on its last attempt", "job_id", id)
	}
	if len(jobs) > 0 {
		q.m.claimed.Add(ctx, int64(len(jobs)), q.m.attrsRescued)
		for _, j := range jobs {
			q.logger.Warn("rescued job with expired lease", "job_id", j.ID, "epoch", j.Epoch, "attempt", j.Attempt)
		}
	}
	return jobs, nil
}

func (q *Queue) claim(ctx context.Context, sql, owner string, args ...any) ([]Job, error) {
	rows, err := q.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: claim: %w", err)
	}
	jobs, err := collectJobs(rows, owner)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: claim: %w", err)
	}
	return jobs, nil
}

// collectJobs reads the rows of a claim (qClaimAvailable, qClaimExpired).
func collectJobs(rows pgx.Rows, owner string) ([]Job, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Job, error) {
		j := Job{Owner: owner}
		var attempt, maxAttempts int32
		err := r.Scan(&j.ID, &j.UniqueKey, &j.Payload, &attempt, &maxAttempts, &j.Epoch, &j.CreatedAt, &j.Traceparent, &j.Tracestate)
		j.Attempt, j.MaxAttempts = int(attempt), int(maxAttempts)
		return j, err
	})
}

// Heartbeat extends the leases of jobs still held by their claims and returns
// the claims whose lease was lost (taken over or finished by another claim).
// Their handlers should stop: nothing they write will commit.
func (q *Queue) Heartbeat(ctx context.Context, jobs []Job) (lost []Job, err error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	ids, epochs := idsEpochs(jobs)
	rows, err := q.pool.Query(ctx, q.sql.heartbeat, ids, epochs, q.now().Add(q.cfg.LeaseDuration))
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	held, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	var missed []Job
	for _, j := range jobs {
		if !held[claimOf(j)] {
			missed = append(missed, j)
		}
	}
	if len(missed) == 0 {
		return nil, nil
	}
	// A job this claim settled meanwhile is not lost: only a changed epoch is.
	ids, epochs = idsEpochs(missed)
	rows, err = q.pool.Query(ctx, q.sql.sameEpoch, ids, epochs)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	settled, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	for _, j := range missed {
		if settled[claimOf(j)] {
			continue
		}
		lost = append(lost, j)
		q.m.leaseLost.Add(ctx, 1, q.m.attrs)
		q.logger.Warn("lease lost: job taken over by another claim; stopping its handler",
			"job_id", j.ID, "epoch", j.Epoch, "owner", j.Owner)
	}
	return lost, nil
}

// Complete marks job done and runs effects (may be nil) in the same
// transaction, guarded by the fencing token. It returns ErrLeaseLost, having
// committed nothing, when the claim no longer holds the job.
func (q *Queue) Complete(ctx context.Context, job Job, effects Complete) error {
	res := q.completeBatch(ctx, []completion{{job: job, effects: effects}})
	return res[0]
}

// Fail records a failed attempt of job (fenced): retried after a backoff, or
// parked when cause is marked permanent (retry.Permanent) or the attempts are
// exhausted. It returns
// ErrLeaseLost when the claim no longer holds the job.
func (q *Queue) Fail(ctx context.Context, job Job, cause error) error {
	res, err := q.fail(ctx, q.pool, []failure{{job: job, cause: cause}})
	if err != nil {
		return err
	}
	q.countFailures(ctx, res)
	return res[0].err
}

// Release gives jobs back (graceful shutdown): claimable at once, attempt
// returned. Jobs no longer held are ignored.
func (q *Queue) Release(ctx context.Context, jobs []Job) (int, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	ids, epochs := idsEpochs(jobs)
	tag, err := q.pool.Exec(ctx, q.sql.release, ids, epochs, q.now())
	if err != nil {
		return 0, fmt.Errorf("leasequeue: release: %w", err)
	}
	q.m.released.Add(ctx, tag.RowsAffected(), q.m.attrs)
	return int(tag.RowsAffected()), nil
}

// ReleaseInstance gives back the jobs held by earlier incarnations of
// instance (lease owners "<instance>/…" other than owner): claimable at
// once under a new epoch, so the dead incarnation's late writes are fenced
// off. A job out of attempts is parked instead. Call it only from the process
// that now is instance (Worker.Run does, when WorkerConfig.Instance is set):
// two live processes sharing an instance name would take each other's jobs
// (fenced, so no second effect, but wasted work).
func (q *Queue) ReleaseInstance(ctx context.Context, instance, owner string) (released, parked int, err error) {
	rows, err := q.pool.Query(ctx, q.sql.releaseInstance, q.cfg.Name, instance, owner, q.now(), q.channel)
	if err != nil {
		return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var state string
		if err := rows.Scan(&id, &state, nil); err != nil {
			return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
		}
		if State(state) == StateDead {
			parked++
			q.m.dead.Add(ctx, 1, q.m.attrs)
			q.logger.Error("job parked: its worker's instance restarted on its last attempt", "job_id", id, "instance", instance)
			continue
		}
		released++
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
	}
	q.m.released.Add(ctx, int64(released), q.m.attrs)
	return released, parked, nil
}

func idsEpochs(jobs []Job) ([]int64, []int64) {
	ids := make([]int64, len(jobs))
	epochs := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i], epochs[i] = j.ID, j.Epoch
	}
	return ids, epochs
}

// claim identifies one claim of a job: the fencing unit.
type claim struct{ id, epoch int64 }

func claimOf(j Job) claim { return claim{j.ID, j.Epoch} }

// collectClaims reads the (id, epoch) rows a fenced statement returned.
func collectClaims(rows pgx.Rows) (map[claim]bool, error) {
	held := map[claim]bool{}
	var c claim
	_, err := pgx.ForEachRow(rows, []any{&c.id, &c.epoch}, func() error {
		held[c] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return held, nil
}

type completion struct {
	job     Job
	effects Complete
}

// completeBatch completes many jobs in one transaction (one commit, one
// fsync, for the whole batch: group commit). Each job is fenced on its own;
// the effects of the jobs still held run in the same transaction. When any
// effect fails, the batch is rolled back and every job is retried alone, so
// one bad job cannot fail the others. It returns one error per completion:
// nil, ErrLeaseLost, or the failure (the job is then failed, fenced).
func (q *Queue) completeBatch(ctx context.Context, cs []completion) []error {
	errs := make([]error, len(cs))
	err := q.completeTx(ctx, cs, errs)
	if err == nil {
		return errs
	}
	if len(cs) == 1 {
		return q.afterSingleFailure(ctx, cs[0], err)
	}
	q.logger.Warn("batch completion failed; completing its jobs one by one", "jobs", len(cs), "error", err)
	for i, c := range cs {
		one := []error{nil}
		if err := q.completeTx(ctx, []completion{c}, one); err != nil {
			errs[i] = q.afterSingleFailure(ctx, c, err)[0]
			continue
		}
		errs[i] = one[0]
	}
	return errs
}

// afterSingleFailure handles a job whose completion transaction failed: an
// effect error fails the attempt (fenced), a commit/connection error leaves
// the job to its lease (the commit may or may not have happened; either way
// the fencing token keeps the outcome single).
func (q *Queue) afterSingleFailure(ctx context.Context, c completion, err error) []error {
	var effErr effectError
	if !errors.As(err, &effErr) {
		q.logger.Error("completion transaction failed; the job is left to its lease",
			"job_id", c.job.ID, "epoch", c.job.Epoch, "error", err)
		return []error{err}
	}
	if ferr := q.Fail(ctx, c.job, effErr.err); ferr != nil && !errors.Is(ferr, ErrLeaseLost) {
		q.logger.Error("recording a failed completion failed; the job is left to its lease",
			"job_id", c.job.ID, "error", ferr)
	}
	return []error{effErr.err}
}

type effectError struct{ err error }

func (e effectError) Error() string { return "job effects: " + e.err.Error() }
func (e effectError) Unwrap() error { return e.err }

type failure struct {
	job   Job
	cause error
}

type failResult struct {
	dead bool
	err  error // ErrLeaseLost when fenced off
}

// fail records failures through db (fenced) and reports, per failure,
// whether the job was parked or the claim had lost it. It is one statement,
// its own transaction on a pool: no BEGIN and COMMIT of their own.
func (q *Queue) fail(ctx context.Context, db pgdb.Executor, fs []failure) ([]failResult, error) {
	n := len(fs)
	ids, epochs := make([]int64, n), make([]int64, n)
	dead, dues, msgs := make([]bool, n), make([]time.Time, n), make([]string, n)
	now := q.now()
	for i, f := range fs {
		ids[i], epochs[i] = f.job.ID, f.job.Epoch
		dead[i] = retry.IsPermanent(f.cause) || f.job.Attempt >= f.job.MaxAttempts
		dues[i] = now.Add(q.cfg.Backoff.Delay(f.job.Attempt))
		msgs[i] = truncate(fmt.Sprintf("attempt %d: %v", f.job.Attempt, f.cause), 2000)
	}
	rows, err := db.Query(ctx, q.sql.fail, ids, epochs, dead, dues, msgs, now)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: fail: %w", err)
	}
	isHeld, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: fail: %w", err)
	}
	res := make([]failResult, n)
	for i, f := range fs {
		if !isHeld[claimOf(f.job)] {
			res[i].err = ErrLeaseLost
			continue
		}
		res[i].dead = dead[i]
		if dead[i] {
			q.logger.Error("job parked", "job_id", f.job.ID, "attempt", f.job.Attempt,
				"max_attempts", f.job.MaxAttempts, "permanent", retry.IsPermanent(f.cause), "error", f.cause)
		} else {
			q.logger.Warn("job attempt failed; will retry", "job_id", f.job.ID, "attempt", f.job.Attempt,
				"retry_at", dues[i], "error", f.cause)
		}
	}
	return res, nil
}

func (q *Queue) countFailures(ctx context.Context, res []failResult) {
	for _, r := range res {
		switch {
		case r.err != nil:
			q.m.fenced.Add(ctx, 1, q.m.attrs)
		case r.dead:
			q.m.dead.Add(ctx, 1, q.m.attrs)
		default:
			q.m.retried.Add(ctx, 1, q.m.attrs)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
