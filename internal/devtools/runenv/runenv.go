// Package runenv is the file through which `make run` (cmd/runlocal) tells
// the other make targets (`make psql`, `make ops`, `make metrics`, `make
// trace`: cmd/localops) where its stack is: database URLs, addresses, the
// operator tokens.
//
// The file is .run/env under the repository root (RUNLOCAL_ENV_FILE
// overrides it), mode 0600 since it holds the operator tokens, written once
// the stack is ready and removed when runlocal stops cleanly. It is a shell
// file of KEY=value lines, so a learner may also source it:
//
//	set -a; . .run/env; set +a
//	psql "$WORKORDER_DATABASE_URL"
//
// Keys: RUNLOCAL_PID (the runlocal process; a file whose process is gone is
// stale), RUNLOCAL_SERVICES (the services in start order), RUNLOCAL_BIN_DIR
// (the binaries the stack runs), RUNLOCAL_TRACE_URL (the local trace store,
// internal/devtools/tracestore), PUBSUB_EMULATOR_HOST, PUBSUB_PROJECT_ID,
// AUTH_TOKEN_URL, AUTH_CLIENT_ID and AUTH_CLIENT_SECRET (the local issuer
// and the demo client, internal/devtools/localstack), and per
// service, with the name upper-cased and "-" as "_" (Key):
// <SERVICE>_DATABASE_URL (services with a database), <SERVICE>_URL (REST
// base URL, /metrics too), <SERVICE>_GRPC_ADDR (services with gRPC),
// <SERVICE>_CLIENT_SECRET (its client at the local issuer), and
// the operator token variables the service reads (WORKORDER_OPERATOR_TOKEN,
// BILLING_OPERATOR_TOKEN, PROVIDER_OPERATOR_TOKEN, CONSOLE_OPERATOR_TOKEN).
package runenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// DefaultPath is the file's path relative to the repository root, where
// make runs.
const DefaultPath = ".run/env"

// PathVar names the environment variable that overrides DefaultPath.
const PathVar = "RUNLOCAL_ENV_FILE"

// Keys runlocal writes besides the per-service ones.
const (
	KeyPID      = "RUNLOCAL_PID"
	KeyServices = "RUNLOCAL_SERVICES"
	KeyBinDir   = "RUNLOCAL_BIN_DIR"
	KeyTraceURL = "RUNLOCAL_TRACE_URL"
	// With `make run TLS=1`: the stack's CA and a client certificate of
	// it, the variables libenv.TLS reads, so the commands run against the
	// stack (make ops, make metrics) verify the services and present a
	// certificate. Absent without TLS.
	KeyTLSCAFile   = "TLS_CA_FILE"
	KeyTLSCertFile = "TLS_CERT_FILE"
	KeyTLSKeyFile  = "TLS_KEY_FILE"
	// The local OIDC issuer's token endpoint and the client that drives the
	// stack from outside (make demo, make token, curl): the variables
	// internal/clientauth reads, so a sourced file configures a caller.
	KeyTokenURL     = "AUTH_TOKEN_URL"
	KeyClientID     = "AUTH_CLIENT_ID"
	KeyClientSecret = "AUTH_CLIENT_SECRET"
	// The local issuer's URL and its operator client, an identity in
	// every service's AUTH_OPERATORS: `make ops` runs a service's operator
	// commands as that client (internal/devtools/localops), so its repairs
	// are audited under a verified identity, not as break-glass. Names of
	// their own, so a sourced file configures no operator by accident.
	KeyIssuer               = "RUNLOCAL_ISSUER"
	KeyOperatorClientID     = "RUNLOCAL_OPERATOR_CLIENT_ID"
	KeyOperatorClientSecret = "RUNLOCAL_OPERATOR_CLIENT_SECRET"
)

// Suffixes of the per-service keys (see Key).
const (
	SuffixDatabaseURL = "_DATABASE_URL"
	SuffixURL         = "_URL"
	SuffixGRPCAddr    = "_GRPC_ADDR"
	// The admin listeners: the operator services, the admin REST gateway
	// and /metrics.
	SuffixAdminURL      = "_ADMIN_URL"
	SuffixAdminGRPCAddr = "_ADMIN_GRPC_ADDR"
	// The service's client secret at the stack's local issuer (its client
	// id is its name): `make ops` runs its commands as the service.
	SuffixClientSecret = "_CLIENT_SECRET"
)

// ErrNotRunning is returned by Load when no `make run` is running.
var ErrNotRunning = errors.New("make run is not running")

// Path returns the file's path: PathVar's value from getenv, else DefaultPath.
func Path(getenv func(string) string) string {
	if p := getenv(PathVar); p != "" {
		return p
	}
	return DefaultPath
}

// Key returns the key of a per-service value: Key("provider-sim",
// SuffixDatabaseURL) is PROVIDER_SIM_DATABASE_URL.
func Key(service, suffix string) string {
	return strings.ToUpper(strings.ReplaceAll(service, "-", "_")) + suffix
}

// Var is one line of the file.
type Var struct{ Key, Value string }

// Env is a loaded file, in the file's order.
type Env []Var

// Get returns the value of key, "" when absent.
func (e Env) Get(key string) string {
	for _, v := range e {
		if v.Key == key {
			return v.Value
		}
	}
	return ""
}

// Services lists RUNLOCAL_SERVICES.
func (e Env) Services() []string { return strings.Fields(e.Get(KeyServices)) }

// Environ returns the file as KEY=value entries, for a child's environment.
func (e Env) Environ() []string {
	out := make([]string, len(e))
	for i, v := range e {
		out[i] = v.Key + "=" + v.Value
	}
	return out
}

// Write writes vars to path (its directory created, mode 0700), mode 0600,
// atomically: a reader never sees half a file.
func Write(path string, vars []Var) error {
	var b bytes.Buffer
	b.WriteString("# Written by make run (cmd/runlocal) for make psql, make ops, make metrics and make trace;\n")
	b.WriteString("# removed when it stops. It holds the operator tokens: keep it to yourself.\n")
	for _, v := range vars {
		if !validKey(v.Key) {
			return fmt.Errorf("runenv: invalid key %q", v.Key)
		}
		fmt.Fprintf(&b, "%s=%s\n", v.Key, quote(v.Value))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".env-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // a no-op after the rename
	if _, err := tmp.Write(b.Bytes()); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// CreateTemp already made it 0600.
	return os.Rename(tmp.Name(), path)
}

// Remove deletes the file at path if the process pid wrote it, so that a
// stack stopping never removes the file of another one started since.
func Remove(path string, pid int) error {
	e, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if e.Get(KeyPID) != strconv.Itoa(pid) {
		return nil
	}
	return os.Remove(path)
}

// Load reads the file at path and checks that the runlocal that wrote it
// is still running. Both failures wrap ErrNotRunning with what to do.
func Load(path string) (Env, error) {
	e, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist; start the stack with `make run` in another terminal and wait for its banner", ErrNotRunning, path)
	}
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(e.Get(KeyPID))
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("runenv: %s: %s %q is not a process id", path, KeyPID, e.Get(KeyPID))
	}
	if !alive(pid) {
		return nil, fmt.Errorf("%w: %s was written by process %d, which is gone (killed?); start the stack again with `make run`", ErrNotRunning, path, pid)
	}
	return e, nil
}

// alive reports whether process pid exists (signal 0 checks without sending).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func read(path string) (Env, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var e Env
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !validKey(k) {
			return nil, fmt.Errorf("runenv: %s:%d: not a KEY=value line", path, n)
		}
		if v, err = unquote(v); err != nil {
			return nil, fmt.Errorf("runenv: %s:%d: %w", path, n, err)
		}
		e = append(e, Var{k, v})
	}
	return e, sc.Err()
}

func validKey(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range k {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// quote leaves values of URL and path characters bare and single-quotes
// others, the way a shell reads them back.
func quote(v string) string {
	safe := v != ""
	for _, c := range v {
		if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@%+,=", c) {
			safe = false
		}
	}
	if safe {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

func unquote(v string) (string, error) {
	if !strings.HasPrefix(v, "'") {
		return v, nil
	}
	var b strings.Builder
	for rest := v; rest != ""; {
		// A sequence of '...' parts joined by \' (how quote escapes a quote).
		if strings.HasPrefix(rest, `\'`) {
			b.WriteByte('\'')
			rest = rest[2:]
			continue
		}
		if !strings.HasPrefix(rest, "'") {
			return "", fmt.Errorf("malformed quoted value %s", v)
		}
		end := strings.IndexByte(rest[1:], '\'')
		if end < 0 {
			return "", fmt.Errorf("unterminated quote in %s", v)
		}
		b.WriteString(rest[1 : 1+end])
		rest = rest[end+2:]
	}
	return b.String(), nil
}
