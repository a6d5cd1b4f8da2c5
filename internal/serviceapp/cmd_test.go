package serviceapp_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// testConfig stands for a service's config.Config.
type testConfig struct {
	Server    server.Config
	PubSub    pubsub.ClientConfig
	Telemetry telemetry.Config
}

// testApp records the configuration it was assembled with.
type testApp struct{ cfg testConfig }

func (a *testApp) Run(context.Context) error { return nil }

// service is a service on the skeleton's command line; built holds the app
// serve assembled, open the operator hook (nil: none).
func service(built **testApp, open serviceapp.OperatorCLI) servicecmd.Service[testConfig, *testApp] {
	return declaring(built, open, nil)
}

// declaring is service with declaration embedded (provision's own part).
func declaring(built **testApp, open serviceapp.OperatorCLI, declaration []byte) servicecmd.Service[testConfig, *testApp] {
	return serviceapp.CommandLine(servicecmd.Service[testConfig, *testApp]{
		Name:        "shipping",
		Declaration: declaration,
		Usage:       "usage: shipping [serve|migrate|provision|outbox|parked|dead-letters|audit]",
		Config: func(r *envconfig.Reader) (testConfig, error) {
			return testConfig{PubSub: pubsub.ClientConfig{ProjectID: r.String("PUBSUB_PROJECT_ID", "")},
				Telemetry: telemetry.Config{ServiceName: "shipping"}}, r.Err()
		},
		Sections: func(c *testConfig) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New: func(_ context.Context, cfg testConfig, _ *slog.Logger, _ telemetry.Providers, _ ...server.Option) (*testApp, error) {
			*built = &testApp{cfg: cfg}
			return *built, nil
		},
	}, serviceapp.Commands[testConfig]{
		PubSub:     func(c *testConfig) *pubsub.ClientConfig { return &c.PubSub },
		Migrations: []pgmigrate.Set{{Name: "shipping", FS: fstest.MapFS{}}},
		Operator:   open,
	})
}

func TestMigrate_NamesTheMissingDatabaseURL(t *testing.T) {
	t.Parallel()
	var a *testApp
	err := service(&a, nil).Run(context.Background(), envconfig.FromMap(nil), []string{"migrate"})
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("err = %v, want it to name DATABASE_URL", err)
	}
}

// The operator groups run the service's operator hook on DATABASE_URL's
// pool, and name the variable when it is missing; without a hook they are
// unknown commands.
func TestOperator_GroupsNeedTheHookAndTheDatabase(t *testing.T) {
	t.Parallel()
	var a *testApp
	if err := service(&a, nil).Run(context.Background(), envconfig.FromMap(nil), []string{"outbox", "list"}); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("no hook: err = %v, want an unknown command", err)
	}
	opened := false
	s := service(&a, func(context.Context, *envconfig.Reader, *pgxpool.Pool, *gpubsub.Client, *slog.Logger) (operator.Operations, string, error) {
		opened = true
		return nil, "", errors.New("not reached")
	})
	for _, group := range []string{"outbox", "parked", "dead-letters", "audit"} {
		err := s.Run(context.Background(), envconfig.FromMap(nil), []string{group, "list"})
		if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
			t.Errorf("%s: err = %v, want it to name DATABASE_URL", group, err)
		}
	}
	if opened || a != nil {
		t.Fatal("the hook ran, or the app was assembled, without a database")
	}
}

// serve resolves the Pub/Sub project before New, and the traces' project
// is the system's.
func TestServe_ResolvesTheProjectsBeforeNew(t *testing.T) {
	t.Parallel()
	var a *testApp
	if err := service(&a, nil).Run(context.Background(), envconfig.FromMap(map[string]string{"PUBSUB_PROJECT_ID": "p-1"}), []string{"serve"}); err != nil {
		t.Fatal(err)
	}
	if a == nil || a.cfg.PubSub.ProjectID != "p-1" {
		t.Fatalf("app %+v, want it assembled with the project", a)
	}
}
