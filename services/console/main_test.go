package main

import (
	"context"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
)

// The console serves and nothing else: it has no database, no Pub/Sub and
// no roles.
func TestUnknownCommandsAndRolesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `"bogus"`},
		{[]string{"migrate"}, `"migrate"`},
		{[]string{"provision"}, `"provision"`},
		{[]string{"serve", "--role", "api"}, "--role"},
	} {
		if err := service().Run(context.Background(), envconfig.FromMap(nil), tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it refused, naming %s", tc.args, err, tc.want)
		}
	}
}

func TestServeStopsAtStartOnInvalidConfigNamingTheVariable(t *testing.T) {
	env := envconfig.FromMap(map[string]string{"CONSOLE_RPC_TIMEOUT": "five", "LOG_LEVEL": "loud"})
	err := service().Run(context.Background(), env, []string{"serve"})
	if err == nil || !strings.Contains(err.Error(), "CONSOLE_RPC_TIMEOUT") {
		t.Fatalf("err = %v, want it to name CONSOLE_RPC_TIMEOUT", err)
	}
}
