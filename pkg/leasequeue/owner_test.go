package leasequeue_test

import (
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
)

func TestInstanceNamesAndOwners(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"a/b", "a b", strings.Repeat("i", leasequeue.MaxInstanceLen+1), "ü"} {
		if leasequeue.ValidateInstance(bad) == nil {
			t.Errorf("instance %q accepted", bad)
		}
	}
	for _, good := range []string{"", "billing-1", "provider_sim.eu-west"} {
		if err := leasequeue.ValidateInstance(good); err != nil {
			t.Errorf("instance %q refused: %v", good, err)
		}
	}
	a, b := leasequeue.NewOwner("billing-1"), leasequeue.NewOwner("billing-1")
	if a == b || !strings.HasPrefix(a, "billing-1/") {
		t.Errorf("owners %q, %q: want distinct, prefixed billing-1/", a, b)
	}
	if anon := leasequeue.NewOwner(""); strings.Contains(anon, "/") {
		t.Errorf("owner without instance %q contains '/': an instance could claim it", anon)
	}
	if leasequeue.ValidateOwner("billing-2/1", "billing-1") == nil || leasequeue.ValidateOwner(a, "billing-1") != nil {
		t.Error("ValidateOwner")
	}
}
