package outbox_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// TestMain runs the benchmarks on the server benchkit reads from the
// environment (fsync on under make bench).
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

// testType is the event type of the benchmark events.
const testType = "test.v1.Happened"

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// event is the n-th event of aggregate agg, shaped as pkg/outbox's tests
// shape theirs.
func event(agg string, n int) outbox.Event {
	return outbox.Event{
		ID: uuid.Must(uuid.NewV7()), AggregateType: "thing", AggregateID: agg, Type: testType,
		SchemaVersion: 1, Payload: []byte(fmt.Sprintf("%s/%d", agg, n)), OccurredAt: time.Now(),
		Headers: map[string]string{outbox.HeaderCorrelationID: "corr-" + agg},
	}
}
