package serviceapp_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/lossless-dev/lossless/internal/envconfig"
)

const (
	shippingDecl = `{"name": "shipping", "http_port": 8200, "publishes": ["shipments"], "subscribes": ["orders"]}`
	ordersDecl   = `{"name": "orders", "http_port": 8300, "publishes": ["orders"], "subscribes": ["shipments"]}`
)

// provisioned runs `shipping provision args...` against a fresh emulator and
// returns the topics and subscriptions it created.
func provisioned(t *testing.T, declaration string, args ...string) (topics, subs []string, err error) {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	var a *testApp
	s := declaring(&a, nil, []byte(declaration))
	env := envconfig.FromMap(map[string]string{"PUBSUB_EMULATOR_HOST": srv.Addr, "PUBSUB_PROJECT_ID": "p"})
	if err := s.Run(context.Background(), env, append([]string{"provision"}, args...)); err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	tr, err := srv.GServer.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/p"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range tr.GetTopics() {
		topics = append(topics, filepath.Base(tp.GetName()))
	}
	sr, err := srv.GServer.ListSubscriptions(ctx, &pubsubpb.ListSubscriptionsRequest{Project: "projects/p"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range sr.GetSubscriptions() {
		subs = append(subs, filepath.Base(sub.GetName()))
	}
	slices.Sort(topics)
	slices.Sort(subs)
	return topics, subs, nil
}

// TestProvision_CreatesTheServicesOwnPart: a binary embeds only its own
// declaration; provision creates the topics it publishes and consumes and its
// subscriptions, nothing of another service's.
func TestProvision_CreatesTheServicesOwnPart(t *testing.T) {
	t.Parallel()
	topics, subs, err := provisioned(t, shippingDecl)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"orders", "shipments", "shipping.orders.dead-letter"}; !slices.Equal(topics, want) {
		t.Errorf("topics %v, want %v", topics, want)
	}
	if want := []string{"shipping.orders", "shipping.orders.dead-letter-inspect"}; !slices.Equal(subs, want) {
		t.Errorf("subscriptions %v, want %v", subs, want)
	}
}

// TestProvision_SystemReadsEveryDeclarationOfTheFolder: -system DIR creates
// every service's part, as one job against an emulator does.
func TestProvision_SystemReadsEveryDeclarationOfTheFolder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, decl := range map[string]string{"shipping": shippingDecl, "orders": ordersDecl} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "service.json"), []byte(decl), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, subs, err := provisioned(t, shippingDecl, "-system", dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"orders.shipments", "orders.shipments.dead-letter-inspect", "shipping.orders", "shipping.orders.dead-letter-inspect"}; !slices.Equal(subs, want) {
		t.Errorf("subscriptions %v, want %v", subs, want)
	}
}

func TestProvision_RefusesAMissingOrForeignDeclaration(t *testing.T) {
	t.Parallel()
	for _, decl := range []string{"", ordersDecl, `{"name": "shipping", "http_port": 8200, "unknown": 1}`} {
		if _, _, err := provisioned(t, decl); err == nil {
			t.Errorf("declaration %q: provision succeeded", decl)
		}
	}
	if _, _, err := provisioned(t, shippingDecl, "extra"); err == nil {
		t.Error("provision with an unexpected argument succeeded")
	}
}
