package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/devtools/tracestore"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// screenshots is where TestConsoleInABrowser writes the README's pictures of
// the console (console-overview.png, console-order.png: the 1280×800 viewport
// of the Overview and of an order's page). Off by default, so that a test run
// never rewrites committed files. A relative directory is relative to
// services/console, where go test runs the test:
//
//	go test ./services/console/ -run TestConsoleInABrowser -args -screenshots=../../docs/images
var screenshots = flag.String("screenshots", "", "write the README's console screenshots (PNG) into this directory")

// chromium returns Debian's chromium (or another Chrome on PATH). Missing, it
// fails the test under CI=true (.ci/run installs it) and skips elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no chromium on PATH: the console's browser tests need it (apt-get install -y chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser starts headless chromium at 1280×800. --no-sandbox only as root:
// Chromium's sandbox refuses to start as root (it needs an unprivileged user
// namespace owner), and CI runs as root; as any other user the sandbox
// stays on.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.WindowSize(1280, 800))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancel)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	// The first action starts the browser; it must not run under a timeout
	// (that would bound the browser's life).
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// testChange authorizes the tests' own changes of the fault knobs.
var testChange = &opsv1.OperatorAuthorization{Ticket: "TEST-console", Actor: "console browser test"}

type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestConsoleInABrowser runs the whole system (as `make run` does, the
// console included) and drives the console in headless chromium.
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser: builds and runs every service")
	}
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	binDir := t.TempDir()
	_, thisFile, _, _ := runtime.Caller(0)
	if err := localstack.Build(ctx, filepath.Join(filepath.Dir(thisFile), "..", ".."), binDir); err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	// The services export their spans here and the console reads them back,
	// as under `make run`.
	traces, err := tracestore.Start(tracestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = traces.Close() })
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(t),
		DatabasePrefix: "console_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
		Ports:          ports,
		Log:            logs,
		TraceEndpoint:  traces.OTLPEndpoint,
		TraceURL:       traces.URL,
		ExtraEnv: map[string][]string{"provider-sim": {
			"PROVIDER_EXEC_BASE=20ms", "PROVIDER_EXEC_PER_POSITION=1ms", "PROVIDER_POLL_INTERVAL=50ms",
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stack.Stop(30 * time.Second); err != nil {
			t.Errorf("stop: %v", err)
		}
		if t.Failed() {
			t.Logf("stack output:\n%s", logs.b.String())
		}
	})
	site := stack.URLs()["console"]
	grpcs := stack.GRPCAddrs()
	// The test creates orders as the stack's demo caller (docs/adr/0017).
	demo, err := stack.Caller("workorder").DialOption(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wconn, err := grpc.NewClient(grpcs["workorder"], grpc.WithTransportCredentials(insecure.NewCredentials()), demo)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close()
	orders := workorderv1.NewWorkOrderServiceClient(wconn)
	pconn, err := grpc.NewClient(stack.AdminGRPCAddrs()["provider-sim"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	faults := providerv1.NewProviderAdminServiceClient(pconn)
	create := func(customer string) string {
		t.Helper()
		resp, err := orders.CreateWorkOrder(ctx, &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{
			CustomerId: customer, Description: "browser test", Positions: 2,
			UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 990}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetWorkOrder().GetId()
	}

	b := browser(t, ctx)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		actx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(actx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	// text reads an element's text without waiting for it ("" when absent).
	text := func(selector string) string {
		return eval(fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.textContent.trim():""})()`, selector))
	}

	t.Run("overview updates without reload", func(t *testing.T) {
		run("open overview", chromedp.Navigate(site+"/"), chromedp.WaitVisible(chromedp.ID("overview")))
		marker := eval(`window.__consoleMark = String(Math.random())`)
		before, _ := strconv.Atoi(text(`[data-figure="orders_created"]`))
		for range 3 {
			create("overview-test")
		}
		waitfor.Condition(t, time.Minute, "Overview's created count rises by 3 without a reload", func() bool {
			n, err := strconv.Atoi(text(`[data-figure="orders_created"]`))
			return err == nil && n >= before+3
		})
		if still := eval(`String(window.__consoleMark)`); still != marker {
			t.Fatalf("document mark %v, was %v: the page reloaded", still, marker)
		}
	})

	t.Run("order found on Orders, its history reaches INVOICED", func(t *testing.T) {
		customer := "browser-" + uuid.NewString()[:8]
		id := create(customer)
		run("search the customer",
			chromedp.Navigate(site+"/orders"),
			chromedp.WaitVisible(chromedp.ID("q")),
			chromedp.SendKeys(chromedp.ID("q"), customer),
			chromedp.Submit(chromedp.ID("q")),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-order=%q] a`, id))),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-order=%q] a`, id))),
			chromedp.WaitVisible(chromedp.ID("order")),
		)
		waitfor.Condition(t, 2*time.Minute, "the order page shows INVOICED, live", func() bool {
			return text(`[data-order-field="status"]`) == "INVOICED" &&
				strings.Contains(text(`[data-order-field="timeline"]`), "Status INVOICED")
		})
		hist := text(`[data-order-field="timeline"]`)
		for _, st := range []string{"CREATED", "HANDED_OFF", "COMPLETED", "INVOICED"} {
			if !strings.Contains(hist, "Status "+st) {
				t.Errorf("timeline %q lacks %s", hist, st)
			}
		}
		// Not logged in: the operator's sources say so, the page stands.
		if src := text(`[data-source="Provider job and messages"]`); !strings.Contains(src, "log in to see") {
			t.Errorf("provider source while logged out: %q", src)
		}
	})

	t.Run("log in and switch a fault knob", func(t *testing.T) {
		run("log in",
			chromedp.Navigate(site+"/login?next=/faults"),
			chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("operator"), "browser-operator"),
			chromedp.SendKeys(chromedp.ID("token"), stack.OperatorToken),
			chromedp.Submit(chromedp.ID("token")),
			chromedp.WaitVisible(chromedp.ID("k-duplicate")),
		)
		run("set duplicate to 0.25 and save",
			chromedp.SetValue(chromedp.ID("k-duplicate"), "0.25"),
			chromedp.SendKeys(chromedp.ID("faults-ticket"), "CHG-browser"),
			chromedp.Submit(chromedp.ID("k-duplicate")),
			chromedp.WaitVisible(chromedp.CSS("p.flash")),
		)
		resp, err := faults.GetFaults(ctx, &providerv1.GetFaultsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetFaults().GetDuplicate(); got != 0.25 {
			t.Fatalf("provider's duplicate knob %v after the form, want 0.25", got)
		}
		// provider-sim recorded the change as the console's, for the
		// session's operator: the console calls with its own ID token and
		// the operator's name, never with the shared token.
		octx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+stack.OperatorToken)
		audit, err := opsv1.NewOperatorServiceClient(pconn).ListOperatorAudit(octx, &opsv1.ListOperatorAuditRequest{Ticket: "CHG-browser"})
		if err != nil {
			t.Fatal(err)
		}
		if rs := audit.GetRecords(); len(rs) != 1 || rs[0].GetAction() != "faults.update" || rs[0].GetActor() != "console:console/browser-operator (shared token)" ||
			rs[0].GetParams().GetFields()["stated_actor"].GetStringValue() != "browser-operator (shared token)" ||
			rs[0].GetParams().GetFields()["after"].GetStructValue().GetFields()["duplicate"].GetNumberValue() != 0.25 {
			t.Fatalf("provider-sim's audit rows of CHG-browser: %v; want the change by the console for browser-operator (shared token)", rs)
		}
		run("open provider-sim's audit",
			chromedp.Navigate(site+"/audit?service=provider-sim&ticket=CHG-browser"),
			chromedp.WaitVisible(chromedp.ID("audit")),
		)
		if got := text("#audit tbody tr td[data-audit-ticket]"); got != "CHG-browser" {
			t.Fatalf("Audit page of provider-sim: first row's ticket %q, want CHG-browser", got)
		}
		if url := eval(`location.href`); strings.Contains(url, stack.OperatorToken) || strings.Contains(text("body"), stack.OperatorToken) {
			t.Fatal("the operator token is in the page or its URL")
		}
	})

	// The timeline of an order run with the provider's duplicate fault on:
	// each service's record of it in causal order, the duplicate visible at
	// the provider and absorbed by the inbox.
	var timelineOrder string
	t.Run("logged-in order timeline across the services", func(t *testing.T) {
		octx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+stack.OperatorToken)
		before, err := faults.GetFaults(ctx, &providerv1.GetFaultsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		dup := proto.Clone(before.GetFaults()).(*providerv1.Faults)
		dup.Duplicate = 1
		// The plan is drawn at acceptance: this order's job gets the duplicate.
		if _, err := faults.UpdateFaults(octx, &providerv1.UpdateFaultsRequest{Faults: dup, Authorization: testChange}); err != nil {
			t.Fatal(err)
		}
		id := create("timeline-" + uuid.NewString()[:8])
		timelineOrder = id
		waitfor.Condition(t, 2*time.Minute, "the order is handed off", func() bool {
			r, err := faults.ListJobs(octx, &providerv1.ListJobsRequest{WorkOrderId: id})
			return err == nil && len(r.GetJobs()) == 1
		})
		if _, err := faults.UpdateFaults(octx, &providerv1.UpdateFaultsRequest{Faults: before.GetFaults(), Authorization: testChange}); err != nil {
			t.Fatal(err)
		}
		waitfor.Condition(t, 2*time.Minute, "the order is INVOICED", func() bool {
			r, err := orders.GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: id})
			return err == nil && r.GetWorkOrder().GetStatus() == workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED
		})
		run("open the order", chromedp.Navigate(site+"/orders/"+id), chromedp.WaitVisible(chromedp.ID("order")))
		type line struct{ Kind, Text string }
		var lines []line
		raw := eval(`JSON.stringify(Array.from(document.querySelectorAll('[data-order-field="timeline"] li')).map(function(li){return {Kind: li.dataset.kind, Text: li.textContent}}))`)
		if err := json.Unmarshal([]byte(raw), &lines); err != nil {
			t.Fatal(err)
		}
		// find returns the index of the first line of kind containing every
		// part, after index from; -1 when none.
		find := func(from int, kind string, parts ...string) int {
			for i := from + 1; i < len(lines); i++ {
				if lines[i].Kind != kind {
					continue
				}
				ok := true
				for _, p := range parts {
					ok = ok && strings.Contains(lines[i].Text, p)
				}
				if ok {
					return i
				}
			}
			return -1
		}
		at := -1
		for _, step := range []struct {
			kind  string
			parts []string
		}{
			{"outbox", []string{"WorkOrderHandOffRequested PUBLISHED"}},
			{"provider-job", []string{"Provider job DONE", "faults: duplicate"}},
			{"provider-message", []string{"Provider message COMPLETED, duplicated", "published 2×"}},
			{"inbox", []string{"Inbox entry APPLIED", "WorkOrderCompleted"}},
			{"billing-job", []string{"Invoice job done", "epoch 1"}},
			{"invoice", []string{"issued"}},
		} {
			next := find(at, step.kind, step.parts...)
			if next < 0 {
				t.Fatalf("after line %d no %s line with %q; timeline:\n%+v", at, step.kind, step.parts, lines)
			}
			at = next
		}
		if n := strings.Count(raw, "Inbox entry APPLIED"); n != 2 {
			t.Errorf("%d applied inbox entries, want 2 (started, completed: the duplicate absorbed); timeline:\n%+v", n, lines)
		}
		if src := text(`[data-source="Inbox entries"]`); !strings.Contains(src, "2 shown") {
			t.Errorf("inbox source: %q", src)
		}
	})

	// The order's spans, read from the trace store the services export to,
	// as a waterfall: every hop from the create request to the receipt of
	// the invoice, each below the one that caused it.
	t.Run("order page shows the trace waterfall", func(t *testing.T) {
		hops := []string{
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
		id := create("trace-" + uuid.NewString()[:8])
		waitfor.Condition(t, 2*time.Minute, "the order is INVOICED", func() bool {
			r, err := orders.GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: id})
			return err == nil && r.GetWorkOrder().GetStatus() == workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED
		})
		type row struct {
			Depth int
			Name  string
		}
		var rows []row
		// found counts the hops among rows, each in a later row than the
		// one before and deeper than it (its cause is above it).
		found := func() int {
			at, depth := -1, -1
			for n, h := range hops {
				next := -1
				for i := at + 1; i < len(rows); i++ {
					if strings.Contains(rows[i].Name, h) && rows[i].Depth > depth {
						next = i
						break
					}
				}
				if next < 0 {
					return n
				}
				at, depth = next, rows[next].Depth
			}
			return len(hops)
		}
		// Spans reach the store within a second of their hop; the page is
		// read again until the last one shows.
		waitfor.Condition(t, time.Minute, "the waterfall reaches process workorder.billing-events", func() bool {
			run("open the order", chromedp.Navigate(site+"/orders/"+id), chromedp.WaitVisible(chromedp.ID("tr-h")))
			raw := eval(`JSON.stringify(Array.from(document.querySelectorAll('table.waterfall tbody tr')).map(function(tr){` +
				`return {Depth: Number(tr.dataset.depth), Name: tr.querySelector('.wf-name').textContent}}))`)
			rows = rows[:0]
			return json.Unmarshal([]byte(raw), &rows) == nil && found() == len(hops)
		})
		if rows[0].Depth != 0 || !strings.Contains(rows[0].Name, hops[0]) {
			t.Errorf("first row %+v, want the create request at depth 0", rows[0])
		}
		if n := eval(`String(document.querySelectorAll('table.waterfall svg[aria-hidden="true"] rect').length)`); n != strconv.Itoa(len(rows)) {
			t.Errorf("%s decorative bars for %d rows", n, len(rows))
		}
		// At a phone's width the waterfall scrolls inside its box; the
		// page does not.
		run("phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(site+"/orders/"+id), chromedp.WaitVisible(chromedp.ID("tr-h")))
		if over := eval(`String(document.documentElement.scrollWidth - window.innerWidth)`); over != "0" {
			t.Errorf("phone: the order page is %s px wider than the viewport", over)
		}
		if inner := eval(`(function(){var b=document.querySelector('table.waterfall').parentElement;return String(b.scrollWidth > b.clientWidth)})()`); inner != "true" {
			t.Errorf("phone: the waterfall does not scroll inside its box")
		}
		run("desktop width", chromedp.EmulateViewport(1280, 800))
	})

	// Both layouts: nothing wider than the viewport (tables scroll inside
	// their own box). CONSOLE_SCREENSHOTS=<dir> keeps a full-page PNG of each
	// page; -screenshots=<dir> writes the README's two (readmeShot).
	t.Run("layout fits 1280x800 and a phone", func(t *testing.T) {
		for _, vp := range []struct {
			name          string
			width, height int64
		}{{"desktop", 1280, 800}, {"phone", 390, 844}} {
			paths := []string{"/", "/orders", "/faults", "/repair"}
			if timelineOrder != "" {
				paths = append(paths, "/orders/"+timelineOrder)
			}
			for _, path := range paths {
				run("open "+path, chromedp.EmulateViewport(vp.width, vp.height), chromedp.Navigate(site+path),
					chromedp.WaitVisible(chromedp.ID("main")))
				if over := eval(`String(document.documentElement.scrollWidth - window.innerWidth)`); over != "0" {
					t.Errorf("%s %s: the page is %s px wider than the viewport", vp.name, path, over)
				}
				if name := readmeShot(vp.name, path, timelineOrder); name != "" && *screenshots != "" {
					actx, cancel := context.WithTimeout(b, 30*time.Second)
					png, err := chromedp.Run(actx, chromedp.CaptureScreenshot())
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					if err := os.MkdirAll(*screenshots, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(*screenshots, name), png, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if dir := os.Getenv("CONSOLE_SCREENSHOTS"); dir != "" {
					actx, cancel := context.WithTimeout(b, 30*time.Second)
					png, err := chromedp.Run(actx, chromedp.FullScreenshot(100))
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					name := vp.name + strings.ReplaceAll(path, "/", "_") + ".png"
					if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	})
}

// readmeShot names the README's picture of a page at a viewport, or "" when
// the README shows none of it.
func readmeShot(viewport, path, order string) string {
	switch {
	case viewport != "desktop":
		return ""
	case path == "/":
		return "console-overview.png"
	case order != "" && path == "/orders/"+order:
		return "console-order.png"
	}
	return ""
}

// TestRepairAndAuditInABrowser parks a poison message in the inbox (the
// provider's poison fault, for one order), then in headless chromium finds
// it on the Repair page, dry-runs its replay, replays it under a ticket and
// an actor, and finds the audit rows of that ticket on the Audit page; the
// effect is checked through the workorder admin API.
func TestRepairAndAuditInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser: builds and runs every service")
	}
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	binDir := t.TempDir()
	_, thisFile, _, _ := runtime.Caller(0)
	if err := localstack.Build(ctx, filepath.Join(filepath.Dir(thisFile), "..", ".."), binDir); err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(t),
		DatabasePrefix: "repair_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
		Ports:          ports,
		Log:            logs,
		ExtraEnv: map[string][]string{"provider-sim": {
			"PROVIDER_EXEC_BASE=20ms", "PROVIDER_EXEC_PER_POSITION=1ms", "PROVIDER_POLL_INTERVAL=50ms",
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stack.Stop(30 * time.Second); err != nil {
			t.Errorf("stop: %v", err)
		}
		if t.Failed() {
			t.Logf("stack output:\n%s", logs.b.String())
		}
	})
	site := stack.URLs()["console"]
	grpcs := stack.GRPCAddrs()
	op := metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+stack.OperatorToken))
	// The test creates orders as the stack's demo caller (docs/adr/0017).
	demo, err := stack.Caller("workorder").DialOption(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wconn, err := grpc.NewClient(grpcs["workorder"], grpc.WithTransportCredentials(insecure.NewCredentials()), demo)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close()
	pconn, err := grpc.NewClient(stack.AdminGRPCAddrs()["provider-sim"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	woAdmin, err := grpc.NewClient(stack.AdminGRPCAddrs()["workorder"], grpc.WithTransportCredentials(insecure.NewCredentials()), demo)
	if err != nil {
		t.Fatal(err)
	}
	defer woAdmin.Close()
	admin := opsv1.NewOperatorServiceClient(woAdmin)
	faults := providerv1.NewProviderAdminServiceClient(pconn)
	setPoison := func(p float64) {
		t.Helper()
		cur, err := faults.GetFaults(op, &providerv1.GetFaultsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		f := cur.GetFaults()
		f.Poison = p
		if _, err := faults.UpdateFaults(op, &providerv1.UpdateFaultsRequest{Faults: f, Authorization: testChange}); err != nil {
			t.Fatal(err)
		}
	}
	setPoison(1)
	if _, err := workorderv1.NewWorkOrderServiceClient(wconn).CreateWorkOrder(ctx, &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{
		CustomerId: "repair-test", Description: "poison", Positions: 1,
		UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 990}}}); err != nil {
		t.Fatal(err)
	}
	var entry int64
	waitfor.Condition(t, 2*time.Minute, "a poison message parked in the inbox", func() bool {
		resp, err := admin.ListInboxEntries(op, &opsv1.ListInboxEntriesRequest{Status: "PARKED", Reason: "POISON"})
		if err != nil || len(resp.GetEntries()) == 0 {
			return false
		}
		entry = resp.GetEntries()[0].GetId()
		return true
	})
	setPoison(0)

	b := browser(t, ctx)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(selector string) string {
		t.Helper()
		actx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(actx, chromedp.Evaluate[string](fmt.Sprintf(
			`(function(){var e=document.querySelector(%q);return e?e.textContent.trim():""})()`, selector)))
		if err != nil {
			t.Fatalf("text of %s: %v", selector, err)
		}
		return v
	}
	ticket := "INC-" + uuid.NewString()[:8]
	box := fmt.Sprintf("e-%d", entry)
	run("log in and open the POISON entries",
		chromedp.Navigate(site+"/login?next="+url.QueryEscape("/repair?reason=POISON")),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("operator"), "browser-operator"),
		chromedp.SendKeys(chromedp.ID("token"), stack.OperatorToken),
		chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID(box)),
	)
	run("dry run of the entry",
		chromedp.SendKeys(chromedp.ID("ticket"), ticket),
		chromedp.Click(chromedp.ID(box)),
		chromedp.Submit(chromedp.ID("ticket")),
		chromedp.WaitVisible(chromedp.ID("res-h")),
	)
	if h := text("#res-h"); h != "Dry run: 1 entries would be replayed" || !strings.Contains(text("#res-h + p"), strconv.FormatInt(entry, 10)) {
		t.Fatalf("dry run shows %q / %q, want entry %d", h, text("#res-h + p"), entry)
	}
	run("replay what the dry run listed",
		chromedp.Click(chromedp.CSS(`form[action="/repair/replay"] button.danger`)),
		chromedp.WaitVisible(chromedp.CSS(`#res-h`)),
	)
	waitfor.Condition(t, 30*time.Second, "the page reports the replay", func() bool {
		return text("#res-h") == "Replayed 1 entries"
	})
	audit, err := opsv1.NewOperatorServiceClient(woAdmin).ListOperatorAudit(op, &opsv1.ListOperatorAuditRequest{Ticket: ticket})
	if err != nil {
		t.Fatal(err)
	}
	if rs := audit.GetRecords(); len(rs) != 2 || rs[0].GetDryRun() || !rs[1].GetDryRun() || rs[0].GetAction() != "inbox.replay" ||
		rs[0].GetActor() != "console:console/browser-operator (shared token)" || rs[0].GetAffected() != 1 { // the console's identity, for its operator
		t.Fatalf("audit rows of %s: %v; want the replay over its dry run, one entry each", ticket, rs)
	}
	run("open the Audit page for the ticket",
		chromedp.Navigate(site+"/audit?ticket="+ticket),
		chromedp.WaitVisible(chromedp.ID("audit")),
	)
	if got := text("#audit tbody tr td[data-audit-ticket]"); got != ticket {
		t.Fatalf("Audit page's first row has ticket %q, want %q", got, ticket)
	}
	if rows := text("#audit caption"); !strings.HasPrefix(rows, "2 rows") {
		t.Fatalf("Audit page: %q, want 2 rows", rows)
	}
}
