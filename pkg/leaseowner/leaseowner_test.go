package leaseowner_test

import (
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/pkg/leaseowner"
)

func TestInstanceNamesAndOwners(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"a/b", "a b", strings.Repeat("i", leaseowner.MaxInstanceLen+1), "ü"} {
		if leaseowner.ValidateInstance(bad) == nil {
			t.Errorf("instance %q accepted", bad)
		}
	}
	for _, good := range []string{"", "billing-1", "provider_sim.eu-west"} {
		if err := leaseowner.ValidateInstance(good); err != nil {
			t.Errorf("instance %q refused: %v", good, err)
		}
	}
	a, b := leaseowner.New("billing-1"), leaseowner.New("billing-1")
	if a == b || !strings.HasPrefix(a, "billing-1/") {
		t.Errorf("owners %q, %q: want distinct, prefixed billing-1/", a, b)
	}
	if anon := leaseowner.New(""); strings.Contains(anon, "/") {
		t.Errorf("owner without instance %q contains '/': an instance could claim it", anon)
	}
	if leaseowner.ValidateOwner("billing-2/1", "billing-1") == nil || leaseowner.ValidateOwner(a, "billing-1") != nil {
		t.Error("ValidateOwner")
	}
}
