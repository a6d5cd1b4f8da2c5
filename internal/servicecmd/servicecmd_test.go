package servicecmd_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// testConfig stands for a service's config.Config.
type testConfig struct {
	Server    server.Config
	Telemetry telemetry.Config
}

// testApp records what it was assembled with and runs nothing.
type testApp struct {
	cfg    testConfig
	logger *slog.Logger
	opts   int
	ran    bool
}

func (a *testApp) Run(context.Context) error { a.ran = true; return nil }

// service is a service whose config reads SHIPPING_ROLE (as SERVICE_ROLE)
// and refuses SHIPPING_BAD; built holds the app serve assembled.
func service(built **testApp, commands map[string]servicecmd.Command) servicecmd.Service[testConfig, *testApp] {
	return servicecmd.Service[testConfig, *testApp]{
		Name:  "shipping",
		Usage: "usage: shipping [serve|migrate|provision|ship]",
		Config: func(r *envconfig.Reader) (testConfig, error) {
			c := testConfig{
				Server:    server.Config{Role: server.Role(r.String("SHIPPING_ROLE", "all"))},
				Telemetry: telemetry.Config{ServiceName: "shipping"},
			}
			if v := r.String("SHIPPING_BAD", ""); v != "" {
				return c, errors.New("SHIPPING_BAD: " + v + " is not allowed")
			}
			return c, r.Err()
		},
		Sections: func(c *testConfig) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New: func(_ context.Context, cfg testConfig, logger *slog.Logger, _ telemetry.Providers, opts ...server.Option) (*testApp, error) {
			*built = &testApp{cfg: cfg, logger: logger, opts: len(opts)}
			return *built, nil
		},
		Commands: commands,
	}
}

func TestServe_RoleFlagOverridesTheEnvironmentAndTheAppRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want server.Role
	}{
		{nil, server.RoleWorker},
		{[]string{"serve"}, server.RoleWorker},
		{[]string{"serve", "--role", "api"}, server.RoleAPI},
	} {
		var a *testApp
		err := service(&a, nil).Run(context.Background(), envconfig.FromMap(map[string]string{"SHIPPING_ROLE": "worker"}), tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if a == nil || !a.ran || a.cfg.Server.Role != tc.want || a.logger == nil || a.opts != 1 {
			t.Fatalf("%v: app %+v; want it run in role %s with the telemetry's logger and the /metrics option", tc.args, a, tc.want)
		}
	}
}

func TestServe_StopsBeforeAssemblingOnABadConfigurationOrFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"SHIPPING_BAD": "x"}, []string{"serve"}, "configuration: SHIPPING_BAD"},
		{nil, []string{"serve", "--role", "both"}, "--role"},
		{nil, []string{"serve", "extra"}, `unexpected argument "extra"`},
	} {
		var a *testApp
		err := service(&a, nil).Run(context.Background(), envconfig.FromMap(tc.env), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || a != nil {
			t.Errorf("%v %v: err %v, app %v; want an error containing %q and no app", tc.env, tc.args, err, a, tc.want)
		}
	}
}

func TestCommands_TheServicesOwnGetTheirArgumentsAndUnknownOnesAreRefused(t *testing.T) {
	t.Parallel()
	var got []string
	var a *testApp
	s := service(&a, map[string]servicecmd.Command{
		"ship": func(_ context.Context, _ *envconfig.Reader, logger *slog.Logger, args []string) error {
			if logger == nil {
				return errors.New("no logger")
			}
			got = args
			return nil
		},
	})
	if err := s.Run(context.Background(), envconfig.FromMap(nil), []string{"ship", "list", "-limit", "5"}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "list -limit 5" {
		t.Fatalf("ship got %q, want the arguments after its name", got)
	}
	err := s.Run(context.Background(), envconfig.FromMap(nil), []string{"bogus"})
	if err == nil || !strings.Contains(err.Error(), `"bogus"`) || !strings.Contains(err.Error(), s.Usage) {
		t.Fatalf("err = %v, want it to name the command and give the usage", err)
	}
	if a != nil {
		t.Fatal("a command assembled the app")
	}
}

// The shared command line alone (the console's) has no migrate or
// provision command (serviceapp.CommandLine adds them), and a process
// without roles refuses --role.
func TestServe_AProcessWithoutDatabasePubSubOrRoles(t *testing.T) {
	t.Parallel()
	var a *testApp
	s := service(&a, nil)
	s.Sections = func(c *testConfig) (*server.Config, telemetry.Config) { return nil, c.Telemetry }
	for _, cmd := range []string{"migrate", "provision"} {
		err := s.Run(context.Background(), envconfig.FromMap(nil), []string{cmd})
		if err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("%s: err = %v, want an unknown command", cmd, err)
		}
	}
	if err := s.Run(context.Background(), envconfig.FromMap(nil), []string{"serve", "--role", "api"}); err == nil || !strings.Contains(err.Error(), "--role") || a != nil {
		t.Fatalf("serve --role: err = %v, app %v; want --role refused before assembling", err, a)
	}
	if err := s.Run(context.Background(), envconfig.FromMap(nil), []string{"serve"}); err != nil || a == nil || !a.ran {
		t.Fatalf("serve: err = %v, app %+v; want it run", err, a)
	}
}
