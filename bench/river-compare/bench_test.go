package rivercompare_test

// Benchmark B3 of docs/performance.md: our lease queue against River v0.51.2,
// each burning down the same number of no-op jobs with the same number of
// workers on the same PostgreSQL server, in turn (River, ours, River, ours),
// reported as the median of the per-round ratios, as B1w is. Run with `make
// bench-river` (fsync on).
//
//	LOSSLESS_B3_JOBS     jobs inserted, then burned down, per side and round (default 100000)
//	LOSSLESS_B3_WORKERS  handlers running at once: River's MaxWorkers, our WorkerConfig.Workers (default 100)
//	LOSSLESS_B3_ROUNDS   A/B rounds (default 2)
//	LOSSLESS_B3_CONTINUOUS  length of each side's continuous run per round (default 30s)
//	LOSSLESS_BENCH_DATA  when set, a directory for b3_rate.csv and b3_rounds.csv

import (
	"context"
	"crypto/rand"
	"encoding/csv"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/lossless-dev/lossless/internal/benchkit"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// TestMain takes the test server from the environment (internal/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

const (
	// target is B3's target against River: ours jobs/s >= 1.0 x River's.
	target = 1.0
	// fillChunk jobs per insert statement, for both queues.
	fillChunk = 5000
	// contChunk jobs per insert statement of the continuous run's producer:
	// an application enqueues a few jobs per transaction, not thousands.
	contChunk = 100
	// pollInterval is both sides' wait between fetches that found no work
	// (River's FetchPollInterval, our PollInterval): a burn-down never idles,
	// so it only bounds the start of each run.
	pollInterval = 20 * time.Millisecond
	// riverFetchCooldown is River's minimum gap between two fetches. River's
	// default (100 ms) would cap it at one fetch of at most MaxWorkers jobs
	// per 100 ms; 2 ms lets it refill its workers as fast as they free up,
	// as our worker claims whenever handlers are free.
	riverFetchCooldown = 2 * time.Millisecond
	// stall bounds one side's burn-down: past it the benchmark fails.
	stall = 15 * time.Minute
	// leaseQueueName is our queue's name (leasequeue_jobs.queue).
	leaseQueueName = "bench"
	// The sides, as the log, the metrics and the CSV series name them.
	riverSide      = "river"
	leasequeueSide = "leasequeue"
)

// Queries run outside the timed path: preparing each side's table and
// checking afterwards that every job reached its final state exactly once.
const (
	qCreateDatabase = `CREATE DATABASE %s`
	// FORCE: a client that failed to close must not leave the database behind.
	qDropDatabase = `DROP DATABASE IF EXISTS %s WITH (FORCE)`
	qRiverVacuum  = `VACUUM ANALYZE river_job`
	qRiverStates  = `SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM river_job`
	qLeaseVacuum  = `VACUUM ANALYZE leasequeue_jobs`
	qLeaseStates  = `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM leasequeue_jobs`
)

// tally records the id of every job a handler ran. The timed path only
// appends; distinctness is checked after. finished is closed once want
// handlers have run; want is known up front for a burn-down and set when
// the producer stops for a continuous run (setWant).
type tally struct {
	n        atomic.Int64
	finished chan struct{}
	once     sync.Once
	mu       sync.Mutex
	want     int64 // 0: not known yet
	ids      []int64
}

func newTally(n int) *tally {
	return &tally{want: int64(n), finished: make(chan struct{}), ids: make([]int64, 0, n)}
}

func (t *tally) add(id int64) {
	t.mu.Lock()
	t.ids = append(t.ids, id)
	ran, want := int64(len(t.ids)), t.want
	t.mu.Unlock()
	t.n.Add(1)
	if want > 0 && ran >= want {
		t.once.Do(func() { close(t.finished) })
	}
}

// setWant sets how many handler runs finish the run.
func (t *tally) setWant(n int) {
	t.mu.Lock()
	t.want = int64(n)
	ran := int64(len(t.ids))
	t.mu.Unlock()
	if ran >= int64(n) {
		t.once.Do(func() { close(t.finished) })
	}
}

// wait blocks until every job's handler has run, failing the benchmark after
// stall.
func (t *tally) wait(tb testing.TB, side string) {
	tb.Helper()
	select {
	case <-t.finished:
	case <-time.After(stall):
		tb.Fatalf("%s: stalled: %d of %d handlers ran", side, t.n.Load(), t.want)
	}
}

// check fails the benchmark unless exactly n distinct jobs were run, each once.
func (t *tally) check(tb testing.TB, side string) {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := slices.Clone(t.ids)
	slices.Sort(ids)
	distinct := len(slices.Compact(ids))
	if int64(distinct) != t.want || int64(len(t.ids)) != t.want {
		tb.Fatalf("%s: %d handler runs of %d distinct jobs for %d jobs: jobs lost or run twice", side, len(t.ids), distinct, t.want)
	}
}

// checkStates fails the benchmark unless the table holds exactly n jobs, all
// in their final successful state: the completions the handlers returned
// were all committed.
func checkStates(tb testing.TB, pool *pgxpool.Pool, side, q string, n int) {
	tb.Helper()
	var final, total int
	if err := pool.QueryRow(context.Background(), q).Scan(&final, &total); err != nil {
		tb.Fatal(err)
	}
	if final != n || total != n {
		tb.Fatalf("%s: %d of %d jobs in their final state (%d rows): lost or duplicated work", side, final, n, total)
	}
}

// ratePoint is one second of a burn-down: jobs run in the second ending at t.
type ratePoint struct {
	t    time.Duration
	rate float64
}

// sampleRate reads count once a second until stop is called, which returns
// the per-second rates.
func sampleRate(count func() int64) (stop func() []ratePoint) {
	done := make(chan struct{})
	var points []ratePoint
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last := int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				c := count()
				points = append(points, ratePoint{now.Sub(start), float64(c - last)})
				last = c
			}
		}
	})
	return func() []ratePoint {
		close(done)
		wg.Wait()
		return points
	}
}

// benchPool is a pool with pgxpool's defaults, as each side's application
// would open it.
func benchPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func exec(tb testing.TB, pool *pgxpool.Pool, q string) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), q); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
}

// riverDatabase creates an empty database on the test server, migrates
// River's schema into it with rivermigrate and returns its connection
// string; it is dropped when the benchmark ends. (pgtest.NewDatabase applies
// goose sets only, and River ships its own migrator.)
func riverDatabase(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	server := pgtest.ServerDSN(tb)
	u, err := url.Parse(server)
	if err != nil {
		tb.Fatal(err)
	}
	name := "b3_river_" + strings.ToLower(rand.Text())
	ident := pgx.Identifier{name}.Sanitize()
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, fmt.Sprintf(qCreateDatabase, ident)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			tb.Errorf("drop %s: %v", name, err)
			return
		}
		defer func() { _ = conn.Close(ctx) }()
		if _, err := conn.Exec(ctx, fmt.Sprintf(qDropDatabase, ident)); err != nil {
			tb.Errorf("drop %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	dsn := u.String()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer pool.Close()
	mig, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		tb.Fatal(err)
	}
	return dsn
}

// noopArgs is River's no-op job.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	t *tally
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	w.t.add(job.ID)
	return nil
}

// burnDownRiver inserts n no-op jobs into a fresh River database with an
// insert-only client, vacuums and checkpoints, then times a client with
// `workers` workers on the default queue from its start until every job's
// handler ran. It returns jobs per second.
func burnDownRiver(b *testing.B, n, workers int) (float64, []ratePoint) {
	b.Helper()
	ctx := context.Background()
	pool := benchPool(b, riverDatabase(b))
	defer pool.Close() // this round's connections do not linger into the next measurement
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		b.Fatal(err)
	}
	params := make([]river.InsertManyParams, 0, fillChunk)
	for i := 0; i < n; i += len(params) {
		params = params[:0]
		for j := 0; j < fillChunk && i+j < n; j++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{}})
		}
		if _, err := inserter.InsertManyFast(ctx, params); err != nil {
			b.Fatal(err)
		}
	}
	exec(b, pool, qRiverVacuum)
	pgtest.Checkpoint(b)

	t := newTally(n)
	client := riverWorkers(b, pool, t, workers)
	stop := sampleRate(t.n.Load)
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	t.wait(b, riverSide)
	elapsed := time.Since(start)
	points := stop()
	finishRiver(b, pool, client, t, n)
	return float64(n) / elapsed.Seconds(), points
}

// riverWorkers is a River client running `workers` no-op handlers on the
// default queue, each recording its job in t.
func riverWorkers(b *testing.B, pool *pgxpool.Pool, t *tally, workers int) *river.Client[pgx.Tx] {
	b.Helper()
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{t: t})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: pollInterval,
	})
	if err != nil {
		b.Fatal(err)
	}
	return client
}

// finishRiver stops the client once every job ran, checks that each of the
// n jobs ran once and is completed, and vacuums.
func finishRiver(b *testing.B, pool *pgxpool.Pool, client *river.Client[pgx.Tx], t *tally, n int) {
	b.Helper()
	// Stop waits for River's completer to commit the last completions.
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		b.Fatal(err)
	}
	t.check(b, riverSide)
	checkStates(b, pool, riverSide, qRiverStates, n)
	// Leaves autovacuum nothing to do on this run's dead rows during the next
	// measurement, the other side's.
	exec(b, pool, qRiverVacuum)
}

// continuousRiver runs River's workers on a fresh database while one
// producer inserts jobs back to back for d; see produce.
func continuousRiver(b *testing.B, d time.Duration, workers int) contRates {
	b.Helper()
	ctx := context.Background()
	pool := benchPool(b, riverDatabase(b))
	defer pool.Close()
	t := newTally(0)
	client := riverWorkers(b, pool, t, workers)
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	params := make([]river.InsertManyParams, contChunk)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}}
	}
	inserted, rate := produce(b, d, t, func() error {
		_, err := client.InsertManyFast(ctx, params)
		return err
	})
	t.setWant(inserted)
	t.wait(b, riverSide)
	finishRiver(b, pool, client, t, inserted)
	return rate
}

// produce calls insert (contChunk jobs a call) back to back for d while the
// workers run, and returns the jobs inserted and the jobs per second the
// handlers ran during d. The caller then waits for the rest to drain.
func produce(b *testing.B, d time.Duration, t *tally, insert func() error) (inserted int, c contRates) {
	b.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if err := insert(); err != nil {
			b.Fatal(err)
		}
		inserted += contChunk
	}
	ran, secs := t.n.Load(), time.Since(start).Seconds()
	return inserted, contRates{ran: float64(ran) / secs, inserted: float64(inserted) / secs}
}

// contRates are a continuous run's jobs per second: run by the handlers,
// and inserted by the producer (ran below inserted: a backlog built up).
type contRates struct{ ran, inserted float64 }

// burnDownLeaseQueue inserts n no-op jobs into a fresh database migrated with
// leasequeue.Migrations, vacuums and checkpoints, then times a Worker with
// `workers` handlers from its start until every job's handler ran. It
// returns jobs per second.
func burnDownLeaseQueue(b *testing.B, n, workers int) (float64, []ratePoint) {
	b.Helper()
	ctx := context.Background()
	pool := benchPool(b, pgtest.NewDatabase(b, leasequeue.Migrations("")))
	defer pool.Close() // as River's
	q := newLeaseQueue(b, pool)
	batch := make([]leasequeue.NewJob, 0, fillChunk)
	for i := 0; i < n; i += len(batch) {
		batch = batch[:0]
		for j := 0; j < fillChunk && i+j < n; j++ {
			batch = append(batch, leasequeue.NewJob{})
		}
		if _, err := q.Enqueue(ctx, pool, batch...); err != nil {
			b.Fatal(err)
		}
	}
	exec(b, pool, qLeaseVacuum)
	pgtest.Checkpoint(b)

	t := newTally(n)
	stop := sampleRate(t.n.Load)
	start := time.Now()
	halt := runLeaseWorkers(b, q, t, workers)
	t.wait(b, leasequeueSide)
	elapsed := time.Since(start)
	points := stop()
	halt()
	finishLeaseQueue(b, pool, t, n)
	return float64(n) / elapsed.Seconds(), points
}

// runLeaseWorkers starts a Worker running `workers` no-op handlers, each
// recording its job in t. halt stops it and returns once the last
// completions are committed.
func runLeaseWorkers(b *testing.B, q *leasequeue.Queue, t *tally, workers int) (halt func()) {
	b.Helper()
	w, err := leasequeue.NewWorker(q, func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		t.add(job.ID)
		return nil, nil
	}, leasequeue.WorkerConfig{Workers: workers, PollInterval: pollInterval})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-stopped; err != nil {
			b.Fatal(err)
		}
	}
}

// finishLeaseQueue checks that each of the n jobs ran once and is done, and
// vacuums, as finishRiver does.
func finishLeaseQueue(b *testing.B, pool *pgxpool.Pool, t *tally, n int) {
	b.Helper()
	t.check(b, leasequeueSide)
	checkStates(b, pool, leasequeueSide, qLeaseStates, n)
	exec(b, pool, qLeaseVacuum)
}

// continuousLeaseQueue is continuousRiver for our lease queue.
func continuousLeaseQueue(b *testing.B, d time.Duration, workers int) contRates {
	b.Helper()
	ctx := context.Background()
	pool := benchPool(b, pgtest.NewDatabase(b, leasequeue.Migrations("")))
	defer pool.Close()
	q := newLeaseQueue(b, pool)
	t := newTally(0)
	halt := runLeaseWorkers(b, q, t, workers)
	batch := make([]leasequeue.NewJob, contChunk)
	inserted, rate := produce(b, d, t, func() error {
		_, err := q.Enqueue(ctx, pool, batch...)
		return err
	})
	t.setWant(inserted)
	t.wait(b, leasequeueSide)
	halt()
	finishLeaseQueue(b, pool, t, inserted)
	return rate
}

func newLeaseQueue(b *testing.B, pool *pgxpool.Pool) *leasequeue.Queue {
	b.Helper()
	q, err := leasequeue.New(pool, leasequeue.Config{Name: leaseQueueName}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	return q
}

// BenchmarkB3_LeaseQueueVsRiver: River and our lease queue each burn down the
// same number of no-op jobs, inserted first into a fresh database of the
// same server and followed by VACUUM ANALYZE and CHECKPOINT, with the same
// number of workers and each with pgxpool's default pool, timed from the
// workers' start until every handler ran; rounds alternate River, ours.
// Each round then runs both sides continuously: workers started on an empty
// fresh database while one producer inserts contChunk jobs a statement, back
// to back, for LOSSLESS_B3_CONTINUOUS; the rate is the jobs run during that
// time, after which the rest drains. Targets: ours >= 1.0 x River in both,
// the median of the per-round ratios. Either side running a job twice, or
// leaving one not completed, fails the benchmark.
func BenchmarkB3_LeaseQueueVsRiver(b *testing.B) {
	n := benchkit.EnvInt(b, "LOSSLESS_B3_JOBS", 100_000)
	workers := benchkit.EnvInt(b, "LOSSLESS_B3_WORKERS", 100)
	rounds := benchkit.EnvInt(b, "LOSSLESS_B3_ROUNDS", 2)
	cont := benchkit.EnvDuration(b, "LOSSLESS_B3_CONTINUOUS", 30*time.Second)
	for b.Loop() {
		var ours, theirs, ratios []float64
		var contOurs, contTheirs, contRatios []float64
		var rates [][]string
		for round := range rounds {
			r, rp := burnDownRiver(b, n, workers)
			l, lp := burnDownLeaseQueue(b, n, workers)
			ours, theirs, ratios = append(ours, l), append(theirs, r), append(ratios, l/r)
			b.Logf("B3 round %d: jobs=%d workers=%d river=%.0f leasequeue=%.0f jobs/s; leasequeue/river=%.2f", round, n, workers, r, l, l/r)
			cr := continuousRiver(b, cont, workers)
			cl := continuousLeaseQueue(b, cont, workers)
			contOurs, contTheirs, contRatios = append(contOurs, cl.ran), append(contTheirs, cr.ran), append(contRatios, cl.ran/cr.ran)
			b.Logf("B3 round %d continuous %v (%d jobs a statement, inserted while working): river ran %.0f of %.0f inserted, leasequeue ran %.0f of %.0f inserted jobs/s; leasequeue/river=%.2f",
				round, cont, contChunk, cr.ran, cr.inserted, cl.ran, cl.inserted, cl.ran/cr.ran)
			for _, p := range rp {
				rates = append(rates, []string{strconv.Itoa(round), riverSide, fmt.Sprintf("%.0f", p.t.Seconds()), fmt.Sprintf("%.0f", p.rate)})
			}
			for _, p := range lp {
				rates = append(rates, []string{strconv.Itoa(round), leasequeueSide, fmt.Sprintf("%.0f", p.t.Seconds()), fmt.Sprintf("%.0f", p.rate)})
			}
		}
		ratio := benchkit.Median(ratios)
		b.ReportMetric(benchkit.Median(ours), "leasequeue_jobs/s")
		b.ReportMetric(benchkit.Median(theirs), "river_jobs/s")
		b.ReportMetric(ratio, "ratio_vs_river")
		b.ReportMetric(benchkit.Median(contOurs), "continuous_leasequeue_jobs/s")
		b.ReportMetric(benchkit.Median(contTheirs), "continuous_river_jobs/s")
		b.ReportMetric(benchkit.Median(contRatios), "continuous_ratio_vs_river")
		met := "met"
		if ratio < target {
			met = "NOT met"
		}
		b.Logf("B3 go=%s GOMAXPROCS=%d fsync=%s jobs=%d workers=%d rounds=%d: leasequeue %.0f jobs/s, River v0.51.2 %.0f jobs/s (medians); leasequeue/river median %.2f, target >= %.1f: %s",
			runtime.Version(), runtime.GOMAXPROCS(0), os.Getenv(benchkit.EnvFsync), n, workers, rounds,
			benchkit.Median(ours), benchkit.Median(theirs), ratio, target, met)
		var perRound [][]string
		for i := range ratios {
			perRound = append(perRound, []string{strconv.Itoa(i), fmt.Sprintf("%.0f", ours[i]), fmt.Sprintf("%.0f", theirs[i]), fmt.Sprintf("%.3f", ratios[i])})
		}
		writeCSV(b, "b3_rate.csv", []string{"round", "side", "t_s", "jobs_per_s"}, rates)
		writeCSV(b, "b3_rounds.csv", []string{"round", "leasequeue_jobs_per_s", "river_jobs_per_s", "leasequeue_over_river"}, perRound)
	}
}

// writeCSV writes a series into LOSSLESS_BENCH_DATA, when it is set.
func writeCSV(tb testing.TB, name string, header []string, rows [][]string) {
	tb.Helper()
	dir := os.Getenv("LOSSLESS_BENCH_DATA")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		tb.Fatal(err)
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows) // WriteAll flushes
	if err := w.Error(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}
