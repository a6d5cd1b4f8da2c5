// Command healthcheck probes an HTTP endpoint and exits 0 when it answers 2xx,
// 1 otherwise. It exists for container healthchecks: the service images are
// distroless (no shell, no curl, no wget), so the probe is a static binary of
// its own, copied next to each service binary (deploy/docker/Dockerfile).
//
// Usage:
//
//	healthcheck [-timeout 2s] URL
//
// Compose runs it as `["CMD", "/usr/local/bin/healthcheck", "http://127.0.0.1:8080/readyz"]`.
// An https:// URL is verified with the service's own TLS_CA_FILE (else the
// system roots), presenting TLS_CERT_FILE/TLS_KEY_FILE when set: the probe
// runs in the service's container, with its environment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/server"
)

// defaultTimeout bounds the whole probe (connect, request, response). Below
// compose's healthcheck timeout, so a hung service yields this binary's
// message rather than Docker's kill.
const defaultTimeout = 2 * time.Second

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stderr, envconfig.New()))
}

// run probes the URL in args and returns the process exit code; failures are
// explained on stderr, which Docker keeps in the container's health log.
func run(ctx context.Context, args []string, stderr io.Writer, env *envconfig.Reader) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", defaultTimeout, "bound on the whole probe")
	fs.Usage = func() {
		_, _ = fmt.Fprintln(stderr, "usage: healthcheck [-timeout 2s] URL")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 1
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 1
	}
	clientTLS, err := libenv.NewTLS(env)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 1
	}
	if err := probe(ctx, fs.Arg(0), *timeout, clientTLS); err != nil {
		_, _ = fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 1
	}
	return 0
}

// probe GETs rawURL and reports any answer other than 2xx as an error.
func probe(ctx context.Context, rawURL string, timeout time.Duration, clientTLS *server.TLS) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", rawURL)
	}
	if timeout <= 0 {
		return errors.New("timeout must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	// No proxy: the target is the container itself; an HTTP_PROXY inherited
	// from the service's environment must not reroute the probe.
	tr := clientTLS.HTTPTransport()
	tr.Proxy = nil
	client := &http.Client{Transport: tr}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Read a little of the body so a readiness failure's reason reaches the
	// health log.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s: %s", u.Redacted(), resp.Status, body)
	}
	return nil
}
