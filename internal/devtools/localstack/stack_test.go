package localstack

import (
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
)

func declaredServices(t *testing.T) catalog.Catalog {
	t.Helper()
	c, err := declared.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPorts_ReplicaOneKeepsTheDeclaredPortsAndLaterReplicasStepByTen(t *testing.T) {
	c := declaredServices(t)
	wo, _ := c.Service("workorder")
	var p Ports
	if got, want := p.replica(wo, 1), (ServicePorts{wo.GRPCPort, wo.HTTPPort, wo.GRPCPort + 100, wo.HTTPPort + 100}); got != want {
		t.Fatalf("replica 1 = %+v, want the declared %+v", got, want)
	}
	if got, want := p.replica(wo, 2), (ServicePorts{wo.GRPCPort + 10, wo.HTTPPort + 10, wo.GRPCPort + 110, wo.HTTPPort + 110}); got != want {
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
	c := declaredServices(t)
	all := p.AllPorts(c, 3)
	withAdmin := 0
	for _, svc := range c {
		if svc.GRPCPort != 0 {
			withAdmin++
		}
	}
	// The emulator, the issuer, the services' public and admin listeners.
	if len(all) != 2+2*3*len(c)+2*3*withAdmin {
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
	c := declaredServices(t)
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

func TestReplicaEnv_LinksRouteEachReplicasDatabasePubSubAndServiceAddresses(t *testing.T) {
	c := declaredServices(t)
	var calls []string
	s := &Stack{
		cfg: Config{Replicas: 2, Services: c, Links: func(instance, target, addr string) (string, error) {
			calls = append(calls, instance+" "+target+" "+addr)
			if target == "provider-sim" {
				return "127.0.0.1:1001", nil
			}
			if target == LinkPostgres {
				return "127.0.0.1:1002", nil
			}
			return "127.0.0.1:1003", nil
		}},
		DSN:        map[string]string{"workorder": "postgres://owner:pw@127.0.0.1:5432/workorder?sslmode=disable"},
		RuntimeDSN: map[string]string{"workorder": "postgres://workorder_app:pw@127.0.0.1:5432/workorder?sslmode=disable"},
		Emulator:   "127.0.0.1:8085",
	}
	wo, _ := c.Service("workorder")
	env, err := s.replicaEnv(wo, s.instance(wo, 2), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"PROVIDER_ADDR=127.0.0.1:1001",
		"DATABASE_URL=postgres://workorder_app:pw@127.0.0.1:1002/workorder?sslmode=disable",
		"PUBSUB_EMULATOR_HOST=127.0.0.1:1003",
	} {
		if !slices.Contains(env, want) {
			t.Errorf("workorder-2 env %v: want %s", env, want)
		}
	}
	for _, want := range []string{
		"workorder-2 provider-sim 127.0.0.1:9101", "workorder-2 postgres 127.0.0.1:5432", "workorder-2 pubsub 127.0.0.1:8085",
	} {
		if !slices.Contains(calls, want) {
			t.Errorf("Links calls %v: want %q", calls, want)
		}
	}

	s.cfg.Links = func(string, string, string) (string, error) { return "", errors.New("no more links") }
	if _, err := s.replicaEnv(wo, s.instance(wo, 1), 1); err == nil || !strings.Contains(err.Error(), "workorder-1 -> provider-sim") {
		t.Fatalf("failing Links: %v, want an error naming the link", err)
	}
	s.cfg.Links = nil
	env, err = s.replicaEnv(wo, s.instance(wo, 1), 1)
	if err != nil || !slices.Contains(env, "PROVIDER_ADDR=127.0.0.1:9091") || slices.ContainsFunc(env, func(e string) bool {
		return strings.HasPrefix(e, "DATABASE_URL=") || strings.HasPrefix(e, "PUBSUB_EMULATOR_HOST=")
	}) {
		t.Fatalf("without Links: %v, %v: want the direct provider address and add's own database and emulator", env, err)
	}
}
