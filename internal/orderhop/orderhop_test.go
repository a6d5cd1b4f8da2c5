package orderhop_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
)

// Observe records each hop under its own label, skips a start that did not
// travel (zero) and clamps clock skew to 0; a nil Recorder is inert.
func TestObserve(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	r, err := orderhop.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Date(2026, 4, 1, 9, 0, 0, 0, time.UTC)
	r.Observe(ctx, orderhop.HandOff, t0, t0.Add(30*time.Millisecond))
	r.Observe(ctx, orderhop.HandOff, t0, t0.Add(10*time.Millisecond))
	r.Observe(ctx, orderhop.Deliver, t0, t0.Add(-time.Second))         // skew
	r.Observe(ctx, orderhop.Correlate, time.Time{}, t0)                // no start
	r.Observe(ctx, orderhop.Hop("nosuchhop"), t0, t0.Add(time.Second)) // not a hop of the path
	var nilRecorder *orderhop.Recorder
	nilRecorder.Observe(ctx, orderhop.HandOff, t0, t0.Add(time.Second))

	got := orderhoptest.Collect(t, reader)
	if h := got[orderhop.HandOff]; h.Count != 2 || h.Sum < 0.0399 || h.Sum > 0.0401 {
		t.Errorf("handoff: %+v, want 2 observations summing to 40 ms", h)
	}
	if h := got[orderhop.Deliver]; h.Count != 1 || h.Sum != 0 {
		t.Errorf("deliver with skew: %+v, want one observation of 0", h)
	}
	if len(got) != 2 {
		t.Errorf("hops observed: %v, want handoff and deliver only", got)
	}
	if orderhop.Time(nil) != (time.Time{}) {
		t.Error("Time(nil) is not the zero time")
	}
}
