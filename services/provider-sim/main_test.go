package main

import (
	"strings"
	"testing"
)

func TestUnknownCommandIsRefused(t *testing.T) {
	if err := run([]string{"bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v, want it to name the command", err)
	}
}

func TestServeStopsAtStartOnInvalidConfigNamingTheVariable(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/providersim")
	t.Setenv("PROVIDER_FAULT_POISON", "2")
	if err := run([]string{"serve"}); err == nil || !strings.Contains(err.Error(), "PROVIDER_FAULT_POISON") {
		t.Fatalf("err = %v, want it to name PROVIDER_FAULT_POISON", err)
	}
}
