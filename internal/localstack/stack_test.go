package localstack

import (
	"encoding/hex"
	"testing"
)

func TestPorts_ReplicaOneKeepsTheDocumentedPortsAndLaterReplicasStepByTen(t *testing.T) {
	var p Ports
	p.setDefaults()
	if got, want := p.replica(1), (ReplicaPorts{9090, 8080, 9091, 8081, 9092, 8082}); got != want {
		t.Fatalf("replica 1 = %+v, want %+v", got, want)
	}
	if got, want := p.replica(2), (ReplicaPorts{9100, 8090, 9101, 8091, 9102, 8092}); got != want {
		t.Fatalf("replica 2 = %+v, want %+v", got, want)
	}
	p.More = []ReplicaPorts{{WorkOrderHTTP: 18080}}
	if got := p.replica(2); got.WorkOrderHTTP != 18080 || got.WorkOrderGRPC != 9100 {
		t.Fatalf("replica 2 with an explicit REST port = %+v", got)
	}
}

func TestFreePortsFor_EveryPortOfEveryReplicaDistinct(t *testing.T) {
	p, err := FreePortsFor(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{p.Emulator: true}
	for k := 1; k <= 3; k++ {
		r := p.replica(k)
		for _, port := range []int{r.WorkOrderGRPC, r.WorkOrderHTTP, r.ProviderGRPC, r.ProviderHTTP, r.BillingGRPC, r.BillingHTTP} {
			if port == 0 || seen[port] {
				t.Fatalf("replica %d: port %d zero or reused (%+v)", k, port, p)
			}
			seen[port] = true
		}
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
	s := &Stack{cfg: Config{Replicas: 2}}
	s.cfg.Ports.setDefaults()
	if got := s.instance("provider-sim", 2); got.ID != "provider-sim-2" || got.GRPC != "127.0.0.1:9101" || got.URL != "http://127.0.0.1:8091" {
		t.Fatalf("provider-sim-2 = %+v", got)
	}
	if got := s.instance("billing", 1); got.ID != "billing-1" || got.GRPC != "127.0.0.1:9092" || got.URL != "http://127.0.0.1:8082" {
		t.Fatalf("billing-1 = %+v", got)
	}
}
