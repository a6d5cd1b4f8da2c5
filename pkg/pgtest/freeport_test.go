package pgtest_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// The ports are distinct, bindable, and (on Linux) below the ephemeral
// range that outgoing connections draw from.
func TestPortsAreDistinctBindableAndOutsideTheEphemeralRange(t *testing.T) {
	t.Parallel()
	ports, err := pgtest.FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d returned twice", p)
		}
		seen[p] = true
		if p < 10000 || p >= 32768 {
			t.Logf("port %d outside [10000, 32768): ephemeral range unknown or unusual here", p)
		}
		var lc net.ListenConfig
		l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		_ = l.Close()
	}
}
