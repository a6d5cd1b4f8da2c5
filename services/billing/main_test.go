package main

import (
	"context"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
)

func TestUnknownCommandIsRefused(t *testing.T) {
	if err := service().Run(context.Background(), envconfig.FromMap(nil), []string{"bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v, want it to name the command", err)
	}
}

// The skeleton's command line: serve stops before anything starts on a bad
// variable, naming it; the operator commands need DATABASE_URL.
func TestServeAndTheOperatorCommandsNameTheVariable(t *testing.T) {
	env := envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/billing", "AUTH_DISABLED": "true", "BILLING_JOBS_MAX_ATTEMPTS": "0"})
	if err := service().Run(context.Background(), env, []string{"serve"}); err == nil || !strings.Contains(err.Error(), "BILLING_JOBS_MAX_ATTEMPTS") {
		t.Fatalf("serve: err = %v, want it to name BILLING_JOBS_MAX_ATTEMPTS", err)
	}
	for _, group := range []string{"outbox", "parked", "dead-letters", "audit"} {
		if err := service().Run(context.Background(), envconfig.FromMap(nil), []string{group, "list"}); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
			t.Errorf("%s: err = %v, want it to name DATABASE_URL", group, err)
		}
	}
}
