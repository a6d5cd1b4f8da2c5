package localstack

import (
	"slices"
	"testing"
)

// Each client of the stack's issuer gets tokens only for the services it
// calls: the demo client for the public APIs, workorder for the provider,
// the console and the operator for every service.
func TestClientAudiences_EachClientOnlyTheServicesItCalls(t *testing.T) {
	t.Parallel()
	got := clientAudiences([]string{"workorder", "provider-sim", "billing", "console"})
	want := map[string][]string{
		DemoClient:     {"workorder", "billing"},
		OperatorClient: {"workorder", "provider-sim", "billing", "console"},
		"workorder":    {"provider-sim"},
		"billing":      {"workorder"},
		"provider-sim": nil,
		"console":      {"workorder", "provider-sim", "billing", "console"},
	}
	if len(got) != len(want) {
		t.Errorf("clients %v, want %v", got, want)
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || !slices.Equal(g, w) {
			t.Errorf("client %s: audiences %v, want %v", id, g, w)
		}
	}
}
