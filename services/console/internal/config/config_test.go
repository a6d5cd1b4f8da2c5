package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/services/console/internal/config"
)

func TestFromEnv_DefaultsAreTheDeclaredPortsAndClosed(t *testing.T) {
	c, err := config.FromEnv(envconfig.FromMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8089" || c.Workorder.GRPC != "localhost:9090" || c.Provider.HTTP != "http://localhost:8081" ||
		c.Billing.GRPC != "localhost:9092" || c.ReadOpen || c.OperatorToken != "" || c.RPCTimeout != 5*time.Second ||
		c.TraceURL != "" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestFromEnv_ErrorsNameTheVariable(t *testing.T) {
	for env, want := range map[string]string{
		config.EnvOperatorToken:   "short",
		config.EnvReadOpen:        "maybe",
		config.EnvWorkorderHTTP:   "localhost:8080",
		config.EnvRPCTimeout:      "five",
		config.EnvTLSCertFile:     "cert.pem",
		config.EnvLogLevel:        "loud",
		config.EnvRunbookBaseURL:  "docs/runbooks",
		config.EnvProviderHTTP:    "ftp://x",
		config.EnvShutdownTimeout: "-1s",
		config.EnvTraceURL:        "127.0.0.1:4318",
	} {
		_, err := config.FromEnv(envconfig.FromMap(map[string]string{env: want}))
		if err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%q: error %v, want one naming %s", env, want, err, env)
		}
	}
}

func TestFromEnv_TraceURL(t *testing.T) {
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{config.EnvTraceURL: "http://127.0.0.1:41234"}))
	if err != nil || c.TraceURL != "http://127.0.0.1:41234" {
		t.Fatalf("TraceURL %q, error %v", c.TraceURL, err)
	}
}
