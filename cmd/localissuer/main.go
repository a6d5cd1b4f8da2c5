// Command localissuer serves internal/devtools/localissuer, a minimal OpenID Connect
// issuer, for docker compose: the services verify their callers' ID tokens
// against it (discovery and JWKS over HTTP) and get their own from it (the
// client-credentials grant), exactly as they do with Google's on GCP
// (docs/adr/0017-caller-identity.md). `make run` and the tests run the same
// issuer in-process (internal/devtools/localstack). Never deploy it: its key lives
// in memory and its clients are in its environment.
//
// Env:
//
//	LOCALISSUER_URL      the issuer URL the services reach it at (the tokens' iss), e.g. http://localissuer:8086; required
//	LOCALISSUER_LISTEN   listen address, default 0.0.0.0:8086
//	LOCALISSUER_CLIENTS  the clients and the audiences each may get tokens for,
//	                     id:secret:audience[|audience...][,...]; required
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/internal/envconfig"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(logger); err != nil {
		logger.Error("localissuer failed", "error", err)
		os.Exit(1)
	}
}

func run(logger *slog.Logger) error {
	env := envconfig.New()
	url := env.Required("LOCALISSUER_URL")
	listen := env.String("LOCALISSUER_LISTEN", "0.0.0.0:8086")
	clientList := env.Required("LOCALISSUER_CLIENTS")
	if err := env.Err(); err != nil {
		return err
	}
	clients, err := localissuer.ParseClients(clientList)
	if err != nil {
		return fmt.Errorf("LOCALISSUER_CLIENTS: %w", err)
	}
	is, err := localissuer.New(url, clients)
	if err != nil {
		return fmt.Errorf("LOCALISSUER_URL: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
	if err != nil {
		return fmt.Errorf("LOCALISSUER_LISTEN: %w", err)
	}
	// /healthz and /readyz as every service (compose probes /readyz): ready
	// once it listens, its key being made before.
	mux := http.NewServeMux()
	mux.Handle("/", is.Handler())
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	logger.Info("local OIDC issuer serving", "issuer", is.URL(), "listen", lis.Addr().String(), "clients", len(clients))
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
