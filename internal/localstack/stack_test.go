package localstack

import (
	"encoding/hex"
	"slices"
	"testing"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/services"
)

func declared(t *testing.T) catalog.Catalog {
	t.Helper()
	c, err := services.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPorts_ReplicaOneKeepsTheDeclaredPortsAndLaterReplicasStepByTen(t *testing.T) {
	c := declared(t)
	wo, _ := c.Service("workorder")
	var p Ports
	if got, want := p.replica(wo, 1), (ServicePorts{wo.GRPCPort, wo.HTTPPort}); got != want {
		t.Fatalf("replica 1 = %+v, want the declared %+v", got, want)
	}
	if got, want := p.replica(wo, 2), (ServicePorts{wo.GRPCPort + 10, wo.HTTPPort + 10}); got != want {
		t.Fatalf("replica 2 = %+v, want %+v", got, want)
	}
	p.Services = map[string][]ServicePorts{"workorder": {{}, {HTTP: 18080}}}
	if got := p.replica(wo, 2); got.HTTP != 18080 || got.GRPC != wo.GRPCPort+10 {
		t.Fatalf("replica 2 with an explicit REST port = %+v", got)
	}
}

func TestFreePortsFor_EveryPortOfEveryReplicaOfEveryDeclaredServiceDistinct(t *testing.T) {
	p, err := FreePortsFor(3)
	if err != nil {
		t.Fatal(err)
	}
	c := declared(t)
	all := p.AllPorts(c, 3)
	if len(all) != 2+2*3*len(c) { // the emulator, the issuer, the services
		t.Fatalf("%d ports for %d services × 3 replicas", len(all), len(c))
	}
	seen := map[int]bool{}
	for _, port := range all {
		if port == 0 || seen[port] {
			t.Fatalf("port %d zero or reused (%+v)", port, p)
		}
		seen[port] = true
	}
}

func TestNewOperatorToken_32RandomBytesHex(t *testing.T) {
	a, err := NewOperatorToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewOperatorToken()
	if raw, err := hex.DecodeString(a); err != nil || len(raw) != 32 {
		t.Fatalf("token %q: want 64 hex characters", a)
	}
	if a == b {
		t.Fatal("two tokens are equal")
	}
}

func TestInstances_WorkorderReplicaKHandsOffToProviderReplicaK(t *testing.T) {
	c := declared(t)
	s := &Stack{cfg: Config{Replicas: 2, Services: c}}
	provider, _ := c.Service("provider-sim")
	if got := s.instance(provider, 2); got.ID != "provider-sim-2" || got.GRPC != "127.0.0.1:9101" || got.URL != "http://127.0.0.1:8091" {
		t.Fatalf("provider-sim-2 = %+v", got)
	}
	wo, _ := c.Service("workorder")
	env := wo.ExpandEnv("workorder-2", "tok", func(_, dep string) string {
		d, _ := c.Service(dep)
		return s.instance(d, 2).GRPC
	})
	if !slices.Contains(env, "PROVIDER_ADDR=127.0.0.1:9101") || !slices.Contains(env, "WORKORDER_OUTBOX_RELAY_ID=workorder-2") {
		t.Fatalf("workorder-2 env %v: want PROVIDER_ADDR of provider-sim-2 and its own relay id", env)
	}
}
