package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// benchProviderEnv makes the provider's own execution time negligible: the
// benchmarks measure our path, not the simulated work.
var benchProviderEnv = []string{"PROVIDER_EXEC_BASE=1ms", "PROVIDER_EXEC_PER_POSITION=0s", "PROVIDER_POLL_INTERVAL=50ms"}

// startBenchStack builds the binaries and starts one replica of every
// declared service as separate processes on the test PostgreSQL server
// (pgtest.ServerDSN, fsync per LOSSLESS_PG_FSYNC), each service in its own
// database named prefix + a random tag + "_" + its declared name, so
// several stacks share the server. extra adds environment per service name
// (localstack.Config.ExtraEnv), after benchProviderEnv for provider-sim.
// The stack stops when the benchmark ends. It returns the stack and the
// work-order service's REST base URL.
func startBenchStack(b *testing.B, prefix string, pprof bool) (*localstack.Stack, string) {
	b.Helper()
	return startBenchStackLinked(b, prefix, pprof, nil)
}

// startBenchStackLinked is startBenchStack with each replica's connections
// routed through links (localstack.Config.Links; nil: every one direct).
func startBenchStackLinked(b *testing.B, prefix string, pprof bool, links func(instance, target, addr string) (string, error)) (*localstack.Stack, string) {
	b.Helper()
	return startBenchStackAt(b, buildServices(context.Background(), b), prefix, pprof, links)
}

// startBenchStackAt is startBenchStackLinked on binaries built already
// (binDir, as localstack.Build or make build lays them out): BenchmarkAB_Capacity
// runs the stacks of two revisions.
func startBenchStackAt(b *testing.B, binDir, prefix string, pprof bool, links func(instance, target, addr string) (string, error)) (*localstack.Stack, string) {
	b.Helper()
	ctx := context.Background()
	ports, err := localstack.FreePorts()
	if err != nil {
		b.Fatal(err)
	}
	env := map[string][]string{"provider-sim": append([]string(nil), benchProviderEnv...)}
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(b),
		DatabasePrefix: prefix + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
		Ports:          ports,
		Log:            discard{},
		ExtraEnv:       env,
		Pprof:          pprof,
		Links:          links,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stack.Stop(30 * time.Second) })
	return stack, stack.URLs()["workorder"]
}
