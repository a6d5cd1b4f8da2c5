package outboxpubsub_test

import (
	"os"
	"testing"

	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
)

// TestMain runs the benchmark on the server benchkit reads from the
// environment (fsync on under make bench).
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

// topicB is the topic the relay publishes to.
const topicB = "events"
