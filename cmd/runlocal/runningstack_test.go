package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/devtools/localops"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
	"github.com/lossless-dev/lossless/internal/devtools/tracestore"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// orderHops are the spans of one order's path, in causal order
// (docs/observability.md, "Traces: following one order", read upwards).
var orderHops = []string{
	"lossless.workorder.v1.WorkOrderService/CreateWorkOrder",
	"outbox dispatch lossless.events.v1.WorkOrderHandOffRequested",
	"lossless.provider.v1.ProviderService/SubmitWorkOrder",
	"provider execute",
	"process workorder.work-order-completed",
	"inbox apply",
	"outbox dispatch lossless.events.v1.WorkOrderCompletionRecorded",
	"process billing.workorder-events",
	"job invoices",
	"outbox dispatch lossless.events.v1.InvoiceIssued",
	"process workorder.billing-events",
}

// checkRunningStack runs what `make psql`, `make ops`, `make metrics` and
// `make trace` run, on the env file of a running runlocal, with one order
// taken from creation to INVOICED.
func checkRunningStack(t *testing.T, envFile string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := runenv.Load(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(envFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("env file %v %v: want mode 0600 (it holds the operator tokens)", st, err)
	}
	for _, k := range []string{"WORKORDER_DATABASE_URL", "BILLING_DATABASE_URL", "PROVIDER_SIM_DATABASE_URL", "WORKORDER_OPERATOR_TOKEN",
		"BILLING_OPERATOR_TOKEN", "PROVIDER_OPERATOR_TOKEN", "PUBSUB_EMULATOR_HOST", "PUBSUB_PROJECT_ID", "WORKORDER_URL", runenv.KeyTraceURL, runenv.KeyTokenURL, runenv.KeyClientID, runenv.KeyClientSecret,
		runenv.KeyIssuer, runenv.KeyOperatorClientID, runenv.KeyOperatorClientSecret} {
		if env.Get(k) == "" {
			t.Errorf("env file has no %s", k)
		}
	}

	// The API refuses a call without a token, and takes make token's.
	if code := status(t, ctx, env.Get("WORKORDER_URL")+"/v1/work-orders", ""); code != http.StatusUnauthorized {
		t.Fatalf("list without a token: HTTP %d, want 401", code)
	}
	var tok bytes.Buffer
	if err := localops.Token(ctx, env, "", &tok); err != nil {
		t.Fatalf("make token: %v", err)
	}
	bearer := "Bearer " + strings.TrimSpace(tok.String())
	id := createOrder(t, ctx, env.Get("WORKORDER_URL"), bearer)
	waitfor.Condition(t, 2*time.Minute, "order "+id+" INVOICED", func() bool {
		return orderStatus(ctx, env.Get("WORKORDER_URL"), id, bearer) == "WORK_ORDER_STATUS_INVOICED"
	})

	t.Run("database URLs", func(t *testing.T) {
		for key, query := range map[string]string{
			"WORKORDER_DATABASE_URL":    "SELECT status FROM work_orders WHERE id = $1",
			"BILLING_DATABASE_URL":      "SELECT state FROM leasequeue_jobs WHERE queue = 'invoices' AND unique_key = $1::text",
			"PROVIDER_SIM_DATABASE_URL": "SELECT current_database() WHERE $1::text IS NOT NULL",
		} {
			conn, err := pgx.Connect(ctx, env.Get(key))
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			var got string
			err = conn.QueryRow(ctx, query, id).Scan(&got)
			_ = conn.Close(ctx)
			if err != nil {
				t.Fatalf("%s: %s: %v", key, query, err)
			}
			want := map[string]string{"WORKORDER_DATABASE_URL": "INVOICED", "BILLING_DATABASE_URL": "done", "PROVIDER_SIM_DATABASE_URL": "providersim"}[key]
			if got != want {
				t.Errorf("%s: %s = %q, want %q", key, query, got, want)
			}
		}
	})

	t.Run("psql and ops", func(t *testing.T) {
		psql, err := localops.PsqlCommand(env, "workorder", []string{"-At", "-c", "SELECT status FROM work_orders WHERE id = '" + id + "'"})
		if err != nil {
			t.Fatal(err)
		}
		if out := runCommand(t, ctx, psql); strings.TrimSpace(out) != "INVOICED" {
			t.Errorf("make psql SERVICE=workorder, SELECT status: %q, want INVOICED", out)
		}
		// A runbook command as written: it needs DATABASE_URL of billing's database.
		ops, err := localops.OpsCommand(env, "billing", []string{"jobs", "list", "-state", "dead"})
		if err != nil {
			t.Fatal(err)
		}
		out := runCommand(t, ctx, ops)
		t.Logf("make ops SERVICE=billing ARGS=\"jobs list -state dead\":\n%s", out)
		if strings.Contains(out, id) {
			t.Errorf("the invoiced order's job is listed as dead:\n%s", out)
		}
		ops, err = localops.OpsCommand(env, "workorder", []string{"inbox", "list", "--status", "APPLIED", "--limit", "5"})
		if err != nil {
			t.Fatal(err)
		}
		if out := runCommand(t, ctx, ops); !strings.Contains(out, id) {
			t.Errorf("make ops SERVICE=workorder ARGS=\"inbox list --status APPLIED\" does not list the order's applied completion:\n%s", out)
		} else {
			t.Logf("make ops SERVICE=workorder ARGS=\"inbox list --status APPLIED --limit 5\":\n%s", out)
		}
		// A repair's dry run is audited under the stack's operator client,
		// which make ops logs in as: a verified identity, not break-glass;
		// the --actor typed is kept as what was stated.
		ops, err = localops.OpsCommand(env, "workorder", []string{"inbox", "cleanup", "--ticket", "CHG-make-ops", "--actor", "runbook-reader", "--dry-run"})
		if err != nil {
			t.Fatal(err)
		}
		runCommand(t, ctx, ops)
		ops, err = localops.OpsCommand(env, "workorder", []string{"audit", "list", "--ticket", "CHG-make-ops"})
		if err != nil {
			t.Fatal(err)
		}
		if out := runCommand(t, ctx, ops); !strings.Contains(out, `"actor":"operator"`) || !strings.Contains(out, `"stated_actor":"runbook-reader"`) {
			t.Errorf("make ops SERVICE=workorder ARGS=\"audit list --ticket CHG-make-ops\": want the dry run by operator, stated runbook-reader:\n%s", out)
		}
	})

	t.Run("metrics table", func(t *testing.T) {
		// Cells the services export once their monitors refreshed (every
		// 15 s, dead letters 30 s): a "-" there is a gauge not yet seen.
		want := map[string][]int{"workorder": {1, 2, 3, 4, 5}, "billing": {1, 2, 5, 6}}
		var table string
		waitfor.Condition(t, 90*time.Second, "every stall gauge in the table", func() bool {
			var b bytes.Buffer
			if err := localops.Metrics(ctx, env, &b); err != nil {
				table = err.Error()
				return false
			}
			table = b.String()
			rows := map[string][]string{}
			for _, l := range strings.Split(table, "\n") {
				if f := strings.Fields(l); len(f) == 7 {
					rows[f[0]] = f
				}
			}
			for svc, cols := range want {
				for _, c := range cols {
					if len(rows[svc]) != 7 || rows[svc][c] == "-" {
						return false
					}
				}
			}
			return rows["provider-sim"] != nil
		})
		t.Logf("make metrics:\n%s", table)
		for _, l := range strings.Split(table, "\n") {
			if f := strings.Fields(l); len(f) == 7 && f[0] == "workorder" && (f[4] != "0" || f[5] != "0") {
				t.Errorf("workorder: parked %s, dead letters %s after one clean order, want 0 and 0:\n%s", f[4], f[5], table)
			}
		}
	})

	t.Run("trace tree", func(t *testing.T) {
		var tree string
		waitfor.Condition(t, 30*time.Second, "every hop of order "+id+" in its trace tree", func() bool {
			o, err := tracestore.Fetch(ctx, env.Get(runenv.KeyTraceURL), id)
			if err != nil {
				tree = err.Error()
				return false
			}
			var b bytes.Buffer
			if err := tracestore.WriteTree(&b, o, false); err != nil {
				t.Fatal(err)
			}
			tree = b.String()
			return hopsInOrder(tree) == len(orderHops)
		})
		t.Logf("make trace ORDER=%s:\n%s", id, tree)
		// A second order's spans stay out of this one's tree.
		other := createOrder(t, ctx, env.Get("WORKORDER_URL"), bearer)
		waitfor.Condition(t, 2*time.Minute, "order "+other+" INVOICED", func() bool {
			return orderStatus(ctx, env.Get("WORKORDER_URL"), other, bearer) == "WORK_ORDER_STATUS_INVOICED"
		})
		var b bytes.Buffer
		if err := localops.Trace(ctx, env, id, false, &b); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(b.String(), "job invoices"); got != 1 || hopsInOrder(b.String()) != len(orderHops) {
			t.Errorf("order %s's tree after a second order: %d job spans, want 1, and every hop:\n%s", id, got, b.String())
		}
	})
}

// hopsInOrder counts the orderHops found in tree, each after the one before.
func hopsInOrder(tree string) int {
	at := 0
	for i, h := range orderHops {
		j := strings.Index(tree[at:], h)
		if j < 0 {
			return i
		}
		at += j + len(h)
	}
	return len(orderHops)
}

func runCommand(t *testing.T, ctx context.Context, c localops.Command) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Env = c.Env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", c.Path, c.Args, err, out)
	}
	return string(out)
}

func createOrder(t *testing.T, ctx context.Context, base, bearer string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/work-orders",
		strings.NewReader(`{"customer_id":"acme","description":"paint the fence","positions":3,"unit_price":{"currency_code":"EUR","minor_units":1250}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", bearer)
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		WorkOrder struct {
			ID string `json:"id"`
		} `json:"workOrder"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil || out.WorkOrder.ID == "" {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	return out.WorkOrder.ID
}

// status is the HTTP status of a GET of url with bearer ("": none).
func status(t *testing.T, ctx context.Context, url, bearer string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if bearer != "" {
		req.Header.Set("Authorization", bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func orderStatus(ctx context.Context, base, id, bearer string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/work-orders/"+id, nil)
	req.Header.Set("Authorization", bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		WorkOrder struct {
			Status string `json:"status"`
		} `json:"workOrder"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return out.WorkOrder.Status
}
