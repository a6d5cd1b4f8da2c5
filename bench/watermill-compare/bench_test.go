package watermillcompare_test

// Benchmark B1w of docs/performance.md: our outbox relay against
// watermill-sql's outbox forwarder, each draining the same backlog on the same
// PostgreSQL server, in turn (A B A B), reported as the median of the
// per-round ratios. Run with `make bench-watermill` (fsync on).
//
//	LOSSLESS_B1W_EVENTS           backlog size (default 100000, not B1's 1000000: every query of
//	                              the forwarder reads all the rows it has not yet forwarded, so its
//	                              drain time grows with the square of the backlog; the ratio grows
//	                              with the backlog and is quoted with it)
//	LOSSLESS_B1W_ROUNDS           A/B rounds (default 2)
//	LOSSLESS_B1W_REPLICAS         relays, and forwarders, draining at once (default 1)
//	LOSSLESS_B1W_WATERMILL_BATCH  the forwarder's rows per query (default outbox.DefaultBatchSize,
//	                              the relay's rows per claim; watermill's own default is 100)
//	LOSSLESS_BENCH_DATA           when set, a directory for b1w_rate.csv and b1w_rounds.csv

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/benchkit"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// TestMain takes the test server from the environment (internal/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

const (
	eventType = "bench.v1.Happened"
	// destTopic is where the forwarder publishes (the counting publisher
	// ignores it); the outbox itself is watermill's forwarder topic.
	destTopic = "work_order_events"
	// forwarderTopic is watermill's default forwarder topic, named so that
	// its tables below are those watermill-sql creates for it.
	forwarderTopic = "forwarder_topic"
	consumerGroup  = "forwarder"
	// target is B1's target against watermill: relay rows/s >= 1.5 x forwarder rows/s.
	target = 1.5
	// fillChunk rows per statement, for both outboxes, as benchkit.Fill writes ours.
	fillChunk = 10_000
)

// The forwarder's tables, as watermill-sql names them for its default topic,
// and the queries the benchmark runs on them (never in the timed path except
// qWatermillAcked, polled as WaitDrained polls our outbox).
const (
	qWatermillTruncate = `TRUNCATE "watermill_forwarder_topic", "watermill_offsets_forwarder_topic"`
	qWatermillVacuum   = `VACUUM ANALYZE "watermill_forwarder_topic"`
	// The forwarder has drained when its consumer group's committed offset is
	// the last row's: the equivalent of our outbox being empty.
	qWatermillAcked = `
SELECT coalesce((SELECT offset_acked FROM "watermill_offsets_forwarder_topic" WHERE consumer_group = $1), 0)
     = (SELECT max("offset") FROM "watermill_forwarder_topic")`
)

// benchHeaders are every event's headers on both sides, as B1's backlog has them.
func benchHeaders() map[string]string {
	return map[string]string{
		outbox.HeaderCorrelationID: "bench",
		outbox.HeaderTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

// tally records the id of every event dispatched (ours) or forwarded
// (watermill's). The timed path only appends; distinctness is checked after.
type tally struct {
	n   atomic.Int64
	mu  sync.Mutex
	ids []uuid.UUID
}

func newTally(n int) *tally { return &tally{ids: make([]uuid.UUID, 0, n)} }

func (t *tally) add(id uuid.UUID) {
	t.mu.Lock()
	t.ids = append(t.ids, id)
	t.mu.Unlock()
	t.n.Add(1)
}

// check fails the benchmark unless exactly n distinct ids were seen, each once.
func (t *tally) check(tb testing.TB, side string, n int) {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := slices.Clone(t.ids)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	distinct := len(slices.Compact(ids))
	if distinct != n || len(t.ids) != n {
		tb.Fatalf("%s: %d deliveries of %d distinct events for a backlog of %d: events lost or delivered twice", side, len(t.ids), distinct, n)
	}
}

// relayDispatcher is our side's no-op dispatcher.
type relayDispatcher struct{ t *tally }

func (d relayDispatcher) Dispatch(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
	d.t.add(ev.ID)
	return nil, nil
}

// countingPublisher is watermill's side's no-op publisher: the forwarder
// publishes each unwrapped event to it.
type countingPublisher struct{ t *tally }

func (p countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		id, err := uuid.Parse(m.UUID)
		if err != nil {
			return err
		}
		p.t.add(id)
	}
	return nil
}

func (countingPublisher) Close() error { return nil }

// ratePoint is one second of a drain: rows delivered in the second ending at t.
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

func benchPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func exec(tb testing.TB, pool *pgxpool.Pool, q string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// drainRelay fills our outbox with B1's backlog and drains it with `replicas`
// relays, each with its own pool; it returns rows per second.
func drainRelay(b *testing.B, dsn string, pool *pgxpool.Pool, replicas, n int) (float64, []ratePoint) {
	b.Helper()
	benchkit.Fill(b, pool, benchkit.Backlog{
		Events:    n,
		EventType: eventType,
		Payload:   []byte(benchkit.AnchorPayload),
		Headers:   benchHeaders(),
	})
	t := newTally(n)
	dispatchers := map[string]outbox.Dispatcher{eventType: relayDispatcher{t}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop := sampleRate(t.n.Load)
	start := time.Now()
	for range replicas {
		rp := benchPool(b, dsn)
		defer rp.Close() // this drain's connections do not linger into the next measurement
		r, err := outbox.NewRelay(rp, dispatchers, outbox.Config{}, discard(), nil)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	benchkit.WaitDrained(b, pool, n, t.n.Load)
	elapsed := time.Since(start)
	points := stop()
	cancel()
	wg.Wait()
	t.check(b, "relay", n)
	return float64(n) / elapsed.Seconds(), points
}

// watermillSchema is the forwarder's outbox as watermill-sql's defaults make
// it, with rows per query set by batch.
func watermillSchema(batch int) wsql.DefaultPostgreSQLSchema {
	return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}
}

// fillWatermill writes the same backlog into the forwarder's outbox through
// watermill's own publishers (the forwarder's envelope around the SQL
// publisher), fillChunk events per INSERT, then vacuums, analyzes and
// checkpoints as benchkit.Fill does. Every event carries B1's payload and
// headers, plus the aggregate and event type our outbox keeps in columns.
func fillWatermill(b *testing.B, pool *pgxpool.Pool, n, batch int) {
	b.Helper()
	exec(b, pool, qWatermillTruncate)
	sqlPub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: watermillSchema(batch)}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	payload := []byte(benchkit.AnchorPayload)
	aggregates := max(n/4, 1) // as benchkit.Fill: four events per aggregate, spread across the backlog
	for from := 0; from < n; from += fillChunk {
		msgs := make([]*message.Message, 0, fillChunk)
		for g := from; g < min(from+fillChunk, n); g++ {
			id, err := uuid.NewV7()
			if err != nil {
				b.Fatal(err)
			}
			m := message.NewMessage(id.String(), payload)
			for k, v := range benchHeaders() {
				m.Metadata.Set(k, v)
			}
			m.Metadata.Set("aggregate_type", "work_order")
			m.Metadata.Set("aggregate_id", "wo-"+strconv.Itoa(g%aggregates))
			m.Metadata.Set("event_type", eventType)
			msgs = append(msgs, m)
		}
		if err := pub.Publish(destTopic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	exec(b, pool, qWatermillVacuum)
	pgtest.Checkpoint(b)
}

// drainWatermill fills the forwarder's outbox and drains it with `replicas`
// forwarders of one consumer group, each with its own pool, publishing to a
// counting publisher; it returns rows per second.
func drainWatermill(b *testing.B, dsn string, pool *pgxpool.Pool, replicas, n, batch int) (float64, []ratePoint) {
	b.Helper()
	fillWatermill(b, pool, n, batch)
	t := newTally(n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var closers []func()
	stop := sampleRate(t.n.Load)
	start := time.Now()
	for range replicas {
		wp := benchPool(b, dsn)
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(wp), wsql.SubscriberConfig{
			ConsumerGroup:  consumerGroup,
			SchemaAdapter:  watermillSchema(batch),
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		fwd, err := forwarder.NewForwarder(sub, countingPublisher{t}, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: forwarderTopic})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = fwd.Run(ctx) })
		closers = append(closers, func() { _ = fwd.Close(); _ = sub.Close(); wp.Close() })
	}
	if !waitfor.Until(10*time.Minute, func() bool { return t.n.Load() >= int64(n) }) {
		b.Fatalf("watermill drain stalled: %d of %d events forwarded", t.n.Load(), n)
	}
	var acked bool
	if !waitfor.Until(time.Minute, func() bool {
		if err := pool.QueryRow(context.Background(), qWatermillAcked, consumerGroup).Scan(&acked); err != nil {
			b.Fatal(err)
		}
		return acked
	}) {
		b.Fatalf("watermill forwarded %d events but did not commit its offset to the last one", n)
	}
	elapsed := time.Since(start)
	points := stop()
	cancel()
	for _, c := range closers {
		c()
	}
	wg.Wait()
	t.check(b, "watermill", n)
	return float64(n) / elapsed.Seconds(), points
}

// BenchmarkB1w_RelayVsWatermill: our relay (claim -> no-op dispatch ->
// delete) and watermill-sql's forwarder (offsets-table consumer -> no-op
// publisher) drain the same backlog, in turn, on the same database server,
// each after a fill, VACUUM ANALYZE and CHECKPOINT. Target: relay >= 1.5 x
// watermill, the median of the per-round ratios. Either side losing an event
// or delivering one twice fails the benchmark.
func BenchmarkB1w_RelayVsWatermill(b *testing.B) {
	n := benchkit.EnvInt(b, "LOSSLESS_B1W_EVENTS", 100_000)
	rounds := benchkit.EnvInt(b, "LOSSLESS_B1W_ROUNDS", 2)
	replicas := benchkit.EnvInt(b, "LOSSLESS_B1W_REPLICAS", 1)
	batch := benchkit.EnvInt(b, "LOSSLESS_B1W_WATERMILL_BATCH", outbox.DefaultBatchSize)
	dsn := pgtest.NewDatabase(b, outbox.Migrations(""))
	pool := benchPool(b, dsn)
	initSub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:  consumerGroup,
		SchemaAdapter:  watermillSchema(batch),
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	if err := initSub.SubscribeInitialize(forwarderTopic); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var ours, theirs, ratios []float64
		var rates [][]string
		for round := range rounds {
			r, rp := drainRelay(b, dsn, pool, replicas, n)
			w, wp := drainWatermill(b, dsn, pool, replicas, n, batch)
			ours, theirs, ratios = append(ours, r), append(theirs, w), append(ratios, r/w)
			b.Logf("B1w round %d: events=%d replicas=%d relay=%.0f watermill=%.0f rows/s; relay/watermill=%.2f", round, n, replicas, r, w, r/w)
			for _, p := range rp {
				rates = append(rates, []string{strconv.Itoa(round), "relay", fmt.Sprintf("%.0f", p.t.Seconds()), fmt.Sprintf("%.0f", p.rate)})
			}
			for _, p := range wp {
				rates = append(rates, []string{strconv.Itoa(round), "watermill", fmt.Sprintf("%.0f", p.t.Seconds()), fmt.Sprintf("%.0f", p.rate)})
			}
		}
		ratio := benchkit.Median(ratios)
		b.ReportMetric(benchkit.Median(ours), "relay_rows/s")
		b.ReportMetric(benchkit.Median(theirs), "watermill_rows/s")
		b.ReportMetric(ratio, "ratio_vs_watermill")
		met := "met"
		if ratio < target {
			met = "NOT met"
		}
		b.Logf("B1w go=%s GOMAXPROCS=%d fsync=%s events=%d rounds=%d replicas=%d watermill-batch=%d: relay %.0f rows/s, watermill-sql forwarder %.0f rows/s (medians); relay/watermill median %.2f, target >= %.1f: %s",
			runtime.Version(), runtime.GOMAXPROCS(0), os.Getenv(benchkit.EnvFsync), n, rounds, replicas, batch,
			benchkit.Median(ours), benchkit.Median(theirs), ratio, target, met)
		var perRound [][]string
		for i := range ratios {
			perRound = append(perRound, []string{strconv.Itoa(i), fmt.Sprintf("%.0f", ours[i]), fmt.Sprintf("%.0f", theirs[i]), fmt.Sprintf("%.3f", ratios[i])})
		}
		writeCSV(b, "b1w_rate.csv", []string{"round", "side", "t_s", "rows_per_s"}, rates)
		writeCSV(b, "b1w_rounds.csv", []string{"round", "relay_rows_per_s", "watermill_rows_per_s", "relay_over_watermill"}, perRound)
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
