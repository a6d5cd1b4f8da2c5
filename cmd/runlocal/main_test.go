package main

import (
	"strings"
	"testing"
)

func TestReplicasFromEnv(t *testing.T) {
	if n, err := replicasFromEnv(""); n != 1 || err != nil {
		t.Fatalf("unset: %d, %v; want 1", n, err)
	}
	if n, err := replicasFromEnv("2"); n != 2 || err != nil {
		t.Fatalf("2: %d, %v", n, err)
	}
	for _, bad := range []string{"0", "-1", "x", "10"} {
		if _, err := replicasFromEnv(bad); err == nil || !strings.Contains(err.Error(), "REPLICAS") {
			t.Errorf("REPLICAS=%s: error %v, want one naming REPLICAS", bad, err)
		}
	}
}

func TestOperatorTokens_GeneratedUnlessSet(t *testing.T) {
	tok, extra, err := operatorTokens("", "")
	if err != nil || len(tok) != 64 || extra != nil {
		t.Fatalf("unset: %q %v %v; want a generated 64-character token", tok, extra, err)
	}
	if again, _, _ := operatorTokens("", ""); again == tok {
		t.Fatal("the same token twice: not random per run")
	}
	if tok, extra, _ := operatorTokens("w-token", ""); tok != "w-token" || extra != nil {
		t.Fatalf("workorder set: %q %v", tok, extra)
	}
	if tok, _, _ := operatorTokens("", "p-token"); tok != "p-token" {
		t.Fatalf("provider set: %q, want it for every service", tok)
	}
	tok, extra, _ = operatorTokens("w-token", "p-token")
	if tok != "w-token" || len(extra["provider-sim"]) != 1 || extra["provider-sim"][0] != "PROVIDER_OPERATOR_TOKEN=p-token" {
		t.Fatalf("both set: %q %v; each service keeps its own", tok, extra)
	}
}

func TestTLSFromEnv(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "1": true, "true": true} {
		if got, err := tlsFromEnv(v); got != want || err != nil {
			t.Errorf("TLS=%q: %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := tlsFromEnv("yes please"); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("TLS=yes please: %v, want an error naming TLS", err)
	}
}
