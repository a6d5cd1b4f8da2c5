package main

import (
	"context"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/pkg/envconfig"
)

func TestUnknownCommandIsRefused(t *testing.T) {
	if err := service().Run(context.Background(), envconfig.New(), []string{"bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v, want it to name the command", err)
	}
}

func TestServeStopsAtStartOnInvalidConfigNamingTheVariable(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/providersim")
	t.Setenv("PROVIDER_FAULT_POISON", "2")
	if err := service().Run(context.Background(), envconfig.New(), []string{"serve"}); err == nil || !strings.Contains(err.Error(), "PROVIDER_FAULT_POISON") {
		t.Fatalf("err = %v, want it to name PROVIDER_FAULT_POISON", err)
	}
}
