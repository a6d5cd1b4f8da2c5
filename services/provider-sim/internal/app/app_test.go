package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/testkit/roletest"
	"github.com/lossless-dev/lossless/migrations"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type bundle struct {
	app  *app.App
	pool *pgxpool.Pool
	base string
	conn *grpc.ClientConn
	// admin and adminBase reach the admin listeners (ProviderAdminService,
	// OperatorService, /v1/faults).
	admin     *grpc.ClientConn
	adminBase string
	stop      func() error
}

// operatorToken guards the fault knobs of the test servers.
const operatorToken = "test-operator-token-0123456789abcdef"

func setup(t *testing.T, exec time.Duration) *bundle {
	t.Helper()
	return setupWithToken(t, exec, operatorToken)
}

func setupWithToken(t *testing.T, exec time.Duration, token string) *bundle {
	t.Helper()
	return setupWith(t, exec, token, nil)
}

// setupWith is setupWithToken with cfg changed by edit (nil: unchanged).
func setupWith(t *testing.T, exec time.Duration, token string, edit func(*app.Config)) *bundle {
	t.Helper()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.ProviderSim()...), migrations.ProviderSim()...)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	cfg := app.Config{
		Auth:        libenv.CallerAuth{Disabled: true}, // caller authentication: tested apart
		DatabaseURL: dsn,
		Server:      server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		PubSub:      pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
		Engine: engine.Config{
			Workers: 2, PollInterval: 20 * time.Millisecond, Lease: time.Second,
			ExecBase: exec, ExecPerPosition: time.Microsecond, NoJitter: true,
		},
		OperatorToken: token,
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := app.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	adminConn, err := grpc.NewClient(a.AdminGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adminConn.Close() })
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &bundle{app: a, pool: pool, base: "http://" + a.HTTPAddr(), conn: conn,
		admin: adminConn, adminBase: "http://" + a.AdminHTTPAddr(), stop: stop}
	waitfor.Condition(t, 5*time.Second, "ready", func() bool { return b.http(t, http.MethodGet, "/readyz", "").status == 200 })
	return b
}

type reply struct {
	status int
	body   string
}

func (b *bundle) http(t *testing.T, method, path, body string) reply {
	t.Helper()
	return b.httpAuth(t, method, path, body, "")
}

// httpAuth sends auth, when not empty, as the Authorization header.
func (b *bundle) httpAuth(t *testing.T, method, path, body, auth string) reply {
	t.Helper()
	return request(t, method, b.base+path, body, auth)
}

// adminHTTP is httpAuth on the admin HTTP listener.
func (b *bundle) adminHTTP(t *testing.T, method, path, body, auth string) reply {
	t.Helper()
	return request(t, method, b.adminBase+path, body, auth)
}

func request(t *testing.T, method, url, body, auth string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(data)}
}

func TestAdminRejectsARateOutsideTheUnitIntervalNamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	ctx := operatorContext(operatorToken)

	_, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{Duplicate: 1.5}, Authorization: opAuth})
	st := status.Convert(err)
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if st.Code() != codes.InvalidArgument || len(fields) != 1 || fields[0] != "faults.duplicate" {
		t.Fatalf("gRPC: %v %v, want INVALID_ARGUMENT naming faults.duplicate", st.Code(), fields)
	}
	if r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"duplicate": 1.5}`, "Bearer "+operatorToken); r.status != http.StatusBadRequest || !strings.Contains(r.body, "faults.duplicate") {
		t.Fatalf("HTTP %d %s, want 400 naming faults.duplicate", r.status, r.body)
	}

	// A valid update is in force at once, with its seed.
	upd, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{
		SplitCompletion: 0.5, ExtraDelay: durationpb.New(10 * time.Millisecond), Seed: 9,
	}, Authorization: opAuth})
	if err != nil || upd.GetFaults().GetSplitCompletion() != 0.5 || upd.GetFaults().GetSeed() != 9 {
		t.Fatalf("update: %v %v", upd, err)
	}
	r := b.adminHTTP(t, http.MethodGet, "/v1/faults", "", "")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"splitCompletion":0.5`) || !strings.Contains(r.body, `"seed":"9"`) {
		t.Fatalf("GET /v1/faults: %d %s", r.status, r.body)
	}
}

// The accept knobs are set over REST like the others, and a p99 below the
// p50 is refused naming the field.
func TestAcceptLatencyKnobsOverRESTAreValidatedAndInForce(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	auth := "Bearer " + operatorToken
	r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"acceptLatencyP50":"1s","acceptLatencyP99":"0.1s"}`, auth)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "faults.accept_latency_p99") {
		t.Fatalf("p99 below p50: HTTP %d %s, want 400 naming faults.accept_latency_p99", r.status, r.body)
	}
	r = b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"acceptTimeout":1.5}`, auth)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "accept_timeout") {
		t.Fatalf("timeout rate 1.5: HTTP %d %s, want 400 naming accept_timeout", r.status, r.body)
	}
	r = b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"acceptLatencyP50":"0.100s","acceptLatencyP99":"1s","acceptTimeout":0.02}`, auth)
	if r.status != http.StatusOK {
		t.Fatalf("valid accept knobs: HTTP %d %s", r.status, r.body)
	}
	got := b.faultsInForce(t)
	for _, want := range []string{`"acceptLatencyP50":"0.100s"`, `"acceptLatencyP99":"1s"`, `"acceptTimeout":0.02`} {
		if !strings.Contains(got, want) {
			t.Fatalf("GET /v1/faults = %s, want %s", got, want)
		}
	}
}

// opAuth is the ticket and actor of the tests' fault changes; authQuery
// the same as the query parameters of PUT /v1/faults.
var opAuth = &opsv1.OperatorAuthorization{Ticket: "INC-7", Actor: "alice"}

const authQuery = "?authorization.ticket=INC-7&authorization.actor=alice"

func operatorContext(token string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
}

// faultsInForce reads the knobs through the open GET.
func (b *bundle) faultsInForce(t *testing.T) string {
	t.Helper()
	r := b.adminHTTP(t, http.MethodGet, "/v1/faults", "", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /v1/faults: %d %s", r.status, r.body)
	}
	return r.body
}

func TestFaultKnobsChangeOnlyWithTheOperatorToken(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	crashLoop := &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{PublishThenCrash: 1}, Authorization: opAuth}

	for _, c := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no token", context.Background(), codes.Unauthenticated},
		{"wrong token", operatorContext("not-the-operator-token-0123456789"), codes.PermissionDenied},
	} {
		if _, err := admin.UpdateFaults(c.ctx, crashLoop); status.Code(err) != c.want {
			t.Errorf("gRPC UpdateFaults with %s: %v, want %v", c.name, err, c.want)
		}
	}
	for _, c := range []struct {
		name, auth string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "Bearer not-the-operator-token-0123456789", http.StatusForbidden},
		{"token without scheme", operatorToken, http.StatusForbidden},
	} {
		if r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"publishThenCrash": 1}`, c.auth); r.status != c.want {
			t.Errorf("PUT /v1/faults with %s: HTTP %d %s, want %d", c.name, r.status, r.body, c.want)
		}
	}
	if body := b.faultsInForce(t); strings.Contains(body, `"publishThenCrash":1`) {
		t.Fatalf("knobs changed by an unauthenticated caller: %s", body)
	}

	if r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"duplicate": 0.25}`, "Bearer "+operatorToken); r.status != http.StatusOK {
		t.Fatalf("PUT /v1/faults with the token: HTTP %d %s", r.status, r.body)
	}
	if body := b.faultsInForce(t); !strings.Contains(body, `"duplicate":0.25`) {
		t.Fatalf("knobs after the operator's PUT: %s", body)
	}
}

func TestWithoutATokenTheFaultKnobsRefuseEveryCallButTheHandOffWorks(t *testing.T) {
	t.Parallel()
	b := setupWithToken(t, time.Millisecond, "")
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	_, err := admin.UpdateFaults(operatorContext(operatorToken), &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{Poison: 1}, Authorization: opAuth})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), app.EnvOperatorToken) {
		t.Fatalf("UpdateFaults on a server without %s: %v, want PERMISSION_DENIED naming it", app.EnvOperatorToken, err)
	}
	if r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"poison": 1}`, "Bearer "+operatorToken); r.status != http.StatusForbidden {
		t.Fatalf("PUT /v1/faults: HTTP %d %s, want 403", r.status, r.body)
	}
	if body := b.faultsInForce(t); strings.Contains(body, `"poison":1`) {
		t.Fatalf("knobs changed: %s", body)
	}
	// The hand-off is not an operator endpoint: no operator token, over gRPC
	// and REST alike (its callers' ID tokens: TestSubmitWorkOrderOnlyFromAllowedCallers).
	id := uuid.NewString()
	if _, err := providerv1.NewProviderServiceClient(b.conn).SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: id, CustomerId: "c-1", Positions: 1,
	}); err != nil {
		t.Fatalf("hand-off over gRPC: %v", err)
	}
	if r := b.http(t, http.MethodPost, "/v1/jobs", `{"workOrderId":"`+uuid.NewString()+`","customerId":"c-1","positions":1}`); r.status != http.StatusOK {
		t.Fatalf("hand-off over REST: HTTP %d %s", r.status, r.body)
	}
	waitfor.Value(t, 5*time.Second, "handed-off job done", "DONE", func() string {
		var s string
		_ = b.pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE work_order_id = $1`, id).Scan(&s)
		return s
	})
}

func TestSubmitOverRESTIsIdempotentAndTheJobCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	id := uuid.NewString()
	body := `{"workOrderId":"` + id + `","customerId":"c-1","description":"paint","positions":3}`

	first := b.http(t, http.MethodPost, "/v1/jobs", body)
	again := b.http(t, http.MethodPost, "/v1/jobs", body)
	var r1, r2 struct {
		Acceptance struct{ JobID string } `json:"acceptance"`
		Created    bool                   `json:"created"`
	}
	if first.status != 200 || again.status != 200 || json.Unmarshal([]byte(first.body), &r1) != nil || json.Unmarshal([]byte(again.body), &r2) != nil {
		t.Fatalf("submit: %d %s / %d %s", first.status, first.body, again.status, again.body)
	}
	if !r1.Created || r2.Created || r1.Acceptance.JobID == "" || r1.Acceptance.JobID != r2.Acceptance.JobID {
		t.Fatalf("first %+v, repeat %+v: want one job, created only once", r1, r2)
	}
	conflict := b.http(t, http.MethodPost, "/v1/jobs", strings.Replace(body, `"positions":3`, `"positions":4`, 1))
	if conflict.status != http.StatusUnprocessableEntity {
		t.Fatalf("same id, other content: HTTP %d %s, want 422", conflict.status, conflict.body)
	}
	if bad := b.http(t, http.MethodPost, "/v1/jobs", `{"workOrderId":"nope","customerId":"c","positions":0}`); bad.status != http.StatusBadRequest ||
		!strings.Contains(bad.body, "work_order_id") || !strings.Contains(bad.body, "positions") {
		t.Fatalf("invalid submit: HTTP %d %s, want 400 naming work_order_id and positions", bad.status, bad.body)
	}
	waitfor.Value(t, 5*time.Second, "job done", "DONE", func() string {
		var s string
		_ = b.pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE work_order_id = $1`, id).Scan(&s)
		return s
	})
}

func TestGracefulShutdownReleasesTheInFlightJob(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	id := uuid.NewString()
	_, err := providerv1.NewProviderServiceClient(b.conn).SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: id, CustomerId: "c-1", Positions: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Value(t, 5*time.Second, "executing", "EXECUTING", func() string {
		var s string
		_ = b.pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE work_order_id = $1`, id).Scan(&s)
		return s
	})
	began := time.Now()
	if err := b.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("shutdown took %v with a job of one minute in flight", took)
	}
	var owner *string
	if err := b.pool.QueryRow(context.Background(), `SELECT lease_owner FROM jobs WHERE work_order_id = $1`, id).Scan(&owner); err != nil || owner != nil {
		t.Fatalf("lease owner after shutdown = %v (err %v), want released for the next instance", owner, err)
	}
}

func TestConfigFromEnvNamesEachBadVariable(t *testing.T) {
	t.Parallel()
	_, err := app.ConfigFromEnv(envconfig.FromMap(map[string]string{
		"PROVIDER_FAULT_DUPLICATE": "1.5",
		"PROVIDER_WORKERS":         "-1",
		"PROVIDER_EXEC_BASE":       "soon",
	}))
	for _, name := range []string{"DATABASE_URL", "PROVIDER_EXEC_BASE"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error %v does not name %s", err, name)
		}
	}
	_, err = app.ConfigFromEnv(envconfig.FromMap(map[string]string{
		"DATABASE_URL":             "postgres://u@127.0.0.1:5432/providersim",
		"PROVIDER_FAULT_DUPLICATE": "1.5",
		"PROVIDER_WORKERS":         "-1",
	}))
	for _, name := range []string{"PROVIDER_FAULT_DUPLICATE", "PROVIDER_WORKERS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error %v does not name %s", err, name)
		}
	}
	_, err = app.ConfigFromEnv(envconfig.FromMap(map[string]string{
		"DATABASE_URL":            "postgres://u@127.0.0.1:5432/providersim",
		"PROVIDER_OPERATOR_TOKEN": "too-short",
	}))
	if err == nil || !strings.Contains(err.Error(), "PROVIDER_OPERATOR_TOKEN") {
		t.Errorf("short operator token: error %v does not name PROVIDER_OPERATOR_TOKEN", err)
	}
	// Caller authentication is on by default: issuer, audience and the
	// allow-list are required.
	_, err = app.ConfigFromEnv(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/providersim"}))
	for _, name := range []string{"AUTH_ISSUER", "AUTH_AUDIENCE", "PROVIDER_ALLOWED_CALLERS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("no auth settings: error %v does not name %s", err, name)
		}
	}
	cfg, err := app.ConfigFromEnv(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/providersim",
		"AUTH_ISSUER": "https://accounts.google.com", "AUTH_AUDIENCE": "provider-sim", "PROVIDER_ALLOWED_CALLERS": "workorder"}))
	if err != nil || cfg.Server.GRPCAddr != ":9091" || cfg.Server.HTTPAddr != ":8081" || cfg.Server.AdminGRPCAddr != ":9191" || cfg.Server.AdminHTTPAddr != ":8181" || len(cfg.AllowedCallers) != 1 {
		t.Fatalf("defaults: %+v %+v %v", cfg.Server, cfg.AllowedCallers, err)
	}
}

// SubmitWorkOrder needs a token (UNAUTHENTICATED without), and one whose
// subject is allowed (PERMISSION_DENIED otherwise): a pod with a valid token
// of its own cannot submit work. The fault knobs and their audit stay
// behind the operator token alone.
func TestSubmitWorkOrderOnlyFromAllowedCallers(t *testing.T) {
	t.Parallel()
	issuerSrv := httptest.NewUnstartedServer(nil)
	issuer, err := localissuer.New("http://"+issuerSrv.Listener.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	issuerSrv.Config.Handler = issuer.Handler()
	issuerSrv.Start()
	t.Cleanup(issuerSrv.Close)
	b := setupWith(t, time.Hour, operatorToken, func(c *app.Config) {
		c.Auth = libenv.CallerAuth{OIDC: server.OIDCConfig{Issuer: issuer.URL(), Audience: "provider-sim"}}
		c.AllowedCallers = []string{"workorder"}
	})
	client := providerv1.NewProviderServiceClient(b.conn)
	as := func(subject string) context.Context {
		tok, err := issuer.Mint(localissuer.Claims{Subject: subject, Audience: "provider-sim"})
		if err != nil {
			t.Fatal(err)
		}
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	req := &providerv1.SubmitWorkOrderRequest{WorkOrderId: uuid.NewString(), CustomerId: "c1", Positions: 1}
	for _, c := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no token", context.Background(), codes.Unauthenticated},
		{"another pod", as("intruder"), codes.PermissionDenied},
		{"the work-order service", as("workorder"), codes.OK},
	} {
		if _, err := client.SubmitWorkOrder(c.ctx, req); status.Code(err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	var jobs int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("jobs = %d (%v), want 1: only the allowed caller's", jobs, err)
	}
	if r := b.adminHTTP(t, http.MethodGet, "/v1/faults", "", ""); r.status != http.StatusOK {
		t.Fatalf("reading the knobs: HTTP %d %s, want 200 (open)", r.status, r.body)
	}
	// The operator token alone changes the knobs and reads their audit.
	if r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+authQuery, `{"duplicate": 0.5}`, "Bearer "+operatorToken); r.status != http.StatusOK {
		t.Fatalf("changing the knobs with the operator token: HTTP %d %s", r.status, r.body)
	}
	if resp, err := opsv1.NewOperatorServiceClient(b.admin).ListOperatorAudit(operatorContext(operatorToken),
		&opsv1.ListOperatorAuditRequest{}); err != nil || len(resp.GetRecords()) != 1 {
		t.Fatalf("the knobs' audit with the operator token: %v %v", resp, err)
	}
}

// Every ProviderAdminService method, as its descriptor lists them, refuses a
// call without the token, except GetFaults (api.OpenAdminMethods): the
// guard covers the service, so a method added later is guarded by default.
func TestEveryAdminMethodButGetFaultsNeedsTheToken(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	roletest.AdminRPCsRefuseWithoutToken(t, roletest.Guarded{
		Addr:    b.app.AdminGRPCAddr(),
		Mounted: b.app.AdminGRPCServices(),
		Open:    []string{providerv1.ProviderAdminService_GetFaults_FullMethodName},
	})
}

// The public listeners serve none of the admin services, over gRPC or
// REST, even to a caller with the operator token.
func TestAdminServicesAreNotOnThePublicListeners(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	roletest.AdminServicesNotOnThePublicListener(t, b.app.GRPCAddr(), b.app.GRPCServices(), b.app.AdminGRPCServices())
	for _, r := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/faults", ""}, {http.MethodPut, "/v1/faults" + authQuery, `{"duplicate": 0.5}`},
		{http.MethodGet, "/v1/jobs/" + uuid.NewString(), ""},
	} {
		if got := b.httpAuth(t, r.method, r.path, r.body, "Bearer "+operatorToken); got.status != http.StatusNotFound {
			t.Errorf("%s %s on the public HTTP listener: %d %s, want 404", r.method, r.path, got.status, got.body)
		}
	}
	if got := b.adminHTTP(t, http.MethodGet, "/v1/faults", "", ""); got.status != http.StatusOK {
		t.Fatalf("GET /v1/faults on the admin listener: %d %s", got.status, got.body)
	}
}
