package e2e

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/loadgen"
	"github.com/lossless-dev/lossless/internal/localstack"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// pathCommits is the number of sequential commits on one order's path from
// create to invoiced: create (1); outbox claim + settle with the hand-off
// (2); provider accept and its event records (3); inbox insert (1);
// correlation (1); outbox claim + settle of WorkOrderCompletionRecorded (2);
// billing intake (1); job claim + completion (2); billing outbox claim +
// settle (2); workorder invoicing (1). It is the commit part of B5's floor.
const pathCommits = 16

// pubsubHops is the number of Pub/Sub hops on the path (work-order-completed,
// workorder-events, billing-events).
const pubsubHops = 3

// BenchmarkB5_EndToEndLatency measures create→invoiced latency under
// open-loop load at 10% and 50% of the system's measured capacity (benchmark
// B5 of docs/performance.md). Environment:
//
//	LOSSLESS_B5_DURATION   open-loop phase length (default 60s; the design's run is 5m)
//	LOSSLESS_B5_CAPACITY_N orders of the closed-loop capacity probe (default 600)
//
// The floor is modelled as pathCommits × the median 1-row commit latency
// measured in the same run, plus pubsubHops × the median publish→receive
// latency of the emulator (approximated by one commit each: both are a
// loopback round trip plus a durable step), plus zero poll waits where
// LISTEN/NOTIFY wakes the next stage.
func BenchmarkB5_EndToEndLatency(b *testing.B) {
	ctx := context.Background()
	duration := envDuration(b, "LOSSLESS_B5_DURATION", time.Minute)
	capN := envInt(b, "LOSSLESS_B5_CAPACITY_N", 600)

	binDir := b.TempDir()
	_, thisFile, _, _ := runtime.Caller(0)
	if err := localstack.Build(ctx, filepath.Dir(filepath.Dir(thisFile)), binDir); err != nil {
		b.Fatal(err)
	}
	ports, err := localstack.FreePorts()
	if err != nil {
		b.Fatal(err)
	}
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(b),
		DatabasePrefix: "b5_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
		Ports:          ports,
		Log:            discard{},
		ExtraEnv: map[string][]string{"provider-sim": {
			// The provider's own execution time is not ours to measure.
			"PROVIDER_EXEC_BASE=1ms", "PROVIDER_EXEC_PER_POSITION=0s", "PROVIDER_POLL_INTERVAL=50ms",
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = stack.Stop(30 * time.Second) }()
	base := stack.URLs()["workorder"]

	b.ResetTimer()
	for range b.N {
		capacity, err := loadgen.Run(ctx, loadgen.Config{BaseURL: base, Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 7})
		if err != nil {
			b.Fatal(err)
		}
		if capacity.Invoiced != capacity.Created {
			b.Fatalf("capacity probe: %d of %d invoiced", capacity.Invoiced, capacity.Created)
		}
		rate := capacity.InvoicedPerSec
		b.ReportMetric(rate, "capacity_orders/s")
		floor := commitFloor(b, pgtest.ServerDSN(b)) * (pathCommits + pubsubHops)
		b.ReportMetric(float64(floor.Microseconds())/1000, "floor_ms")
		for _, load := range []struct {
			name string
			frac float64
		}{{"10pct", 0.1}, {"50pct", 0.5}} {
			res, err := loadgen.Run(ctx, loadgen.Config{
				BaseURL: base, Rate: rate * load.frac, Duration: duration, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 11,
			})
			if err != nil {
				b.Fatal(err)
			}
			if res.Invoiced != res.Created {
				b.Fatalf("%s: %d of %d invoiced: a benchmark that loses an effect has failed", load.name, res.Invoiced, res.Created)
			}
			p50 := time.Duration(res.LatencyP50)
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms_"+load.name)
			b.ReportMetric(float64(time.Duration(res.LatencyP99).Microseconds())/1000, "p99_ms_"+load.name)
			b.ReportMetric(float64(p50)/float64(floor), "p50/floor_"+load.name)
		}
	}
}

// commitFloor is the median latency of a 1-row insert commit on the same
// server, measured now, in a scratch table of the server's own database.
func commitFloor(b *testing.B, serverDSN string) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	table := pgx.Identifier{"b5_floor_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id bigint)"); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "DROP TABLE "+table) }()
	lat := make([]time.Duration, 0, 200)
	for i := range 200 {
		start := time.Now()
		if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat[len(lat)/2]
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// envDuration and envInt read a benchmark knob; a value that does not parse
// stops the benchmark naming the variable rather than running the default.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration such as 2m", name, v)
	}
	return d
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
