// Package declaredtest gives tests the whole system's Pub/Sub topology, read
// from every services/<name>/service.json of the checkout
// (internal/devtools/declared), for an emulator holding every topic and
// subscription the services' code names.
package declaredtest

import (
	"testing"

	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// Topology is declared.Topology, failing tb when the declarations do not parse.
func Topology(tb testing.TB) pubsub.Topology {
	tb.Helper()
	t, err := declared.Topology()
	if err != nil {
		tb.Fatal(err)
	}
	return t
}
