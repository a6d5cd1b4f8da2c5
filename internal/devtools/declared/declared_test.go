package declared_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// TestCatalog_FromAPackageFolderReadsEveryServiceFolder: tests run from their
// package's folder; the checkout's root is found above it, and every folder
// under services/ with a declaration is in the catalog.
func TestCatalog_FromAPackageFolderReadsEveryServiceFolder(t *testing.T) {
	c, err := declared.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	root, err := declared.Root(".")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, declared.Dir, "*", catalog.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 || len(c) != len(files) {
		t.Fatalf("catalog has %d services, want one per %s (%d)", len(c), catalog.FileName, len(files))
	}
	for _, f := range files {
		if name := filepath.Base(filepath.Dir(f)); !slices.Contains(c.Names(), name) {
			t.Errorf("%s is not in the catalog", f)
		}
	}
}

// TestTopology_EveryServiceProvisioningItsOwnPartCreatesTheSystem: each
// service's `provision` creates its declaration's part (Service.Topology);
// run for every service, they create exactly the whole system's topology,
// each topic and subscription with the same settings.
func TestTopology_EveryServiceProvisioningItsOwnPartCreatesTheSystem(t *testing.T) {
	c, err := declared.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	system, err := declared.Topology()
	if err != nil {
		t.Fatal(err)
	}
	topics, subs := map[string]pubsub.Topic{}, map[string]pubsub.Subscription{}
	for _, s := range c {
		part := s.Topology()
		if err := part.Validate(); err != nil {
			t.Fatalf("service %s: %v", s.Name, err)
		}
		for _, tp := range part.Topics {
			if prev, ok := topics[tp.ID]; ok && !reflect.DeepEqual(prev, tp) {
				t.Errorf("topic %s: provisioned differently by two services: %+v, %+v", tp.ID, prev, tp)
			}
			topics[tp.ID] = tp
		}
		for _, sub := range part.Subscriptions {
			subs[sub.ID] = sub
		}
	}
	if len(topics) != len(system.Topics) || len(subs) != len(system.Subscriptions) {
		t.Fatalf("the services' parts hold %d topics and %d subscriptions, the system %d and %d",
			len(topics), len(subs), len(system.Topics), len(system.Subscriptions))
	}
	for _, tp := range system.Topics {
		if got, ok := topics[tp.ID]; !ok || !reflect.DeepEqual(got, tp) {
			t.Errorf("topic %s: the services' parts have %+v (%v), the system %+v", tp.ID, got, ok, tp)
		}
	}
	for _, sub := range system.Subscriptions {
		if got, ok := subs[sub.ID]; !ok || !reflect.DeepEqual(got, sub) {
			t.Errorf("subscription %s: the services' parts have %+v (%v), the system %+v", sub.ID, got, ok, sub)
		}
	}
}

func TestRoot_NoCheckoutAbove(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// go.mod without a services folder next to it is not a checkout's root.
	if root, err := declared.Root(dir); err == nil && root == dir {
		t.Fatalf("Root(%s) = %s, want the go.mod without services/ skipped", dir, root)
	}
}
