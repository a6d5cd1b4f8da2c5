package engine_test

import (
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

// One job executed to DONE observes the provider's three hops once each:
// accepted → started, started → completed (at least the configured
// execution time), completion recorded → published.
func TestHopsOfOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	reader := sdkmetric.NewManualReader()
	cfg := testConfig()
	cfg.ExecBase = 20 * time.Millisecond
	e, err := engine.New(b.pool, b.pub, b.dice, cfg, b.logger, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	start(t, e)
	acc := b.submit(t, e, 1)
	waitfor.Value(t, 5*time.Second, "job done", "DONE", func() string { return b.jobStatus(t, acc.JobID) })

	got := orderhoptest.Collect(t, reader)
	for _, hop := range []orderhop.Hop{orderhop.ProviderStart, orderhop.ProviderExecute, orderhop.ProviderPublish} {
		if got[hop].Count != 1 {
			t.Errorf("%s observed %d times, want once (all: %+v)", hop, got[hop].Count, got)
		}
	}
	if ex := got[orderhop.ProviderExecute].Sum; ex < 0.020 {
		t.Errorf("execute hop %v s, shorter than the 20 ms execution", ex)
	}
}
