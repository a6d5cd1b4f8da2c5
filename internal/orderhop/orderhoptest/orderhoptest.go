// Package orderhoptest reads the hop histogram (package orderhop) back from
// an OpenTelemetry ManualReader, for tests asserting that a component
// observes the hop it ends.
package orderhoptest

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/lossless-dev/lossless/internal/orderhop"
)

// Hop is what the histogram holds for one hop.
type Hop struct {
	Count uint64
	Sum   float64 // seconds
	Max   float64 // seconds
}

// Collect returns the histogram's content per hop.
func Collect(t testing.TB, reader *sdkmetric.ManualReader) map[orderhop.Hop]Hop {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[orderhop.Hop]Hop{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok || m.Name != orderhop.InstrumentName {
				continue
			}
			for _, dp := range h.DataPoints {
				v, _ := dp.Attributes.Value("hop")
				hop := out[orderhop.Hop(v.AsString())]
				hop.Count += dp.Count
				hop.Sum += dp.Sum
				if mx, ok := dp.Max.Value(); ok && mx > hop.Max {
					hop.Max = mx
				}
				out[orderhop.Hop(v.AsString())] = hop
			}
		}
	}
	return out
}
