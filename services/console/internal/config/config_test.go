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
	if c.HTTPAddr != ":8089" || c.Workorder.GRPC != "localhost:9090" || c.Provider.HTTP != "http://localhost:8181" ||
		c.Billing.GRPC != "localhost:9092" || c.Workorder.AdminGRPC != "localhost:9190" || c.Provider.AdminGRPC != "localhost:9191" ||
		c.Billing.AdminGRPC != "localhost:9192" || c.Workorder.HTTP != "http://localhost:8180" || c.ReadOpen || c.OperatorToken != "" || c.RPCTimeout != 5*time.Second ||
		c.TraceURL != "" || c.ProviderAuth.Audience != "provider-sim" || c.BillingAuth.Audience != "billing" || !c.CallsAsItself() {
		t.Fatalf("defaults %+v", c)
	}
}

func TestFromEnv_ErrorsNameTheVariable(t *testing.T) {
	for env, want := range map[string]string{
		"CONSOLE_PROVIDER_GRPC_ADDR": "provider-sim:9091",
		config.EnvOperatorToken:      "short",
		config.EnvReadOpen:           "maybe",
		config.EnvWorkorderHTTP:      "localhost:8080",
		config.EnvRPCTimeout:         "five",
		config.EnvTLSCertFile:        "cert.pem",
		config.EnvLogLevel:           "loud",
		config.EnvRunbookBaseURL:     "docs/runbooks",
		config.EnvProviderHTTP:       "ftp://x",
		config.EnvShutdownTimeout:    "-1s",
		config.EnvTraceURL:           "127.0.0.1:4318",
		config.EnvSessionTTL:         "-1h",
		config.EnvSessionIdle:        "soon",
		config.EnvLoginFailures:      "-3",
		config.EnvLoginWindow:        "ten",
		config.EnvIAPAudience:        "console",
		config.EnvTrustedProxies:     "10.0.0.0/8,the-load-balancer",
	} {
		_, err := config.FromEnv(envconfig.FromMap(map[string]string{env: want}))
		if err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%q: error %v, want one naming %s", env, want, err, env)
		}
	}
}

// The console calls the operator services as itself unless AUTH_DISABLED
// is true; only then does an operators file need the break-glass token,
// which it would call them with.
func TestFromEnv_OperatorsFileNeedsTheTokenOnlyWithoutIdentity(t *testing.T) {
	file := map[string]string{config.EnvOperatorsFile: "/etc/console/operators"}
	c, err := config.FromEnv(envconfig.FromMap(file))
	if err != nil || !c.CallsAsItself() {
		t.Fatalf("operators file, console identity: CallsAsItself %v, error %v; want true, none", c.CallsAsItself(), err)
	}
	file["AUTH_DISABLED"] = "true"
	c, err = config.FromEnv(envconfig.FromMap(file))
	if err == nil || !strings.Contains(err.Error(), config.EnvOperatorsFile) || !strings.Contains(err.Error(), config.EnvOperatorToken) || c.CallsAsItself() {
		t.Fatalf("operators file, AUTH_DISABLED, no token: error %v; want one naming %s and %s", err, config.EnvOperatorsFile, config.EnvOperatorToken)
	}
}

func TestFromEnv_TraceURL(t *testing.T) {
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{config.EnvTraceURL: "http://127.0.0.1:41234"}))
	if err != nil || c.TraceURL != "http://127.0.0.1:41234" {
		t.Fatalf("TraceURL %q, error %v", c.TraceURL, err)
	}
}

// Cookies are Secure unless the console listens on loopback over plain
// HTTP without CONSOLE_SECURE_COOKIES.
func TestSecure_UnlessLoopbackPlainHTTP(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{config.EnvHTTPAddr: "127.0.0.1:8089"}, false},
		{map[string]string{config.EnvHTTPAddr: "[::1]:8089"}, false},
		{map[string]string{config.EnvHTTPAddr: "localhost:8089"}, false},
		{map[string]string{}, true}, // ":8089": every interface
		{map[string]string{config.EnvHTTPAddr: "0.0.0.0:8089"}, true},
		{map[string]string{config.EnvHTTPAddr: "10.0.0.7:8089"}, true},
		{map[string]string{config.EnvHTTPAddr: "127.0.0.1:8089", config.EnvSecureCookies: "true"}, true},
		{map[string]string{config.EnvHTTPAddr: "127.0.0.1:8089", config.EnvTLSCertFile: "c.pem", config.EnvTLSKeyFile: "k.pem"}, true},
	} {
		c, err := config.FromEnv(envconfig.FromMap(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if c.Secure() != tc.want {
			t.Errorf("%v: Secure() = %v, want %v", tc.env, c.Secure(), tc.want)
		}
	}
}

func TestFromEnv_SessionAndLoginDefaults(t *testing.T) {
	c, err := config.FromEnv(envconfig.FromMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.SessionTTL != 8*time.Hour || c.SessionIdle != 30*time.Minute || c.LoginFailures != 10 || c.LoginWindow != 15*time.Minute || c.OperatorsFile != "" {
		t.Fatalf("defaults %+v", c)
	}
}
