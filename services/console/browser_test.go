package main_test

import (
	"bytes"
	"context"
	"fmt"
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

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/localstack"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

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
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(t),
		DatabasePrefix: "console_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
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
	wconn, err := grpc.NewClient(grpcs["workorder"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close()
	orders := workorderv1.NewWorkOrderServiceClient(wconn)
	pconn, err := grpc.NewClient(grpcs["provider-sim"], grpc.WithTransportCredentials(insecure.NewCredentials()))
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
				strings.Contains(text(`[data-order-field="history"]`), "INVOICED")
		})
		hist := text(`[data-order-field="history"]`)
		for _, st := range []string{"CREATED", "HANDED_OFF", "COMPLETED", "INVOICED"} {
			if !strings.Contains(hist, st) {
				t.Errorf("history %q lacks %s", hist, st)
			}
		}
	})

	t.Run("log in and switch a fault knob", func(t *testing.T) {
		run("log in",
			chromedp.Navigate(site+"/login?next=/faults"),
			chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("token"), stack.OperatorToken),
			chromedp.Submit(chromedp.ID("token")),
			chromedp.WaitVisible(chromedp.ID("k-duplicate")),
		)
		run("set duplicate to 0.25 and save",
			chromedp.SetValue(chromedp.ID("k-duplicate"), "0.25"),
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
		if url := eval(`location.href`); strings.Contains(url, stack.OperatorToken) || strings.Contains(text("body"), stack.OperatorToken) {
			t.Fatal("the operator token is in the page or its URL")
		}
	})

	// Both layouts: nothing wider than the viewport (tables scroll inside
	// their own box). CONSOLE_SCREENSHOTS=<dir> keeps a PNG of each page.
	t.Run("layout fits 1280x800 and a phone", func(t *testing.T) {
		for _, vp := range []struct {
			name          string
			width, height int64
		}{{"desktop", 1280, 800}, {"phone", 390, 844}} {
			for _, path := range []string{"/", "/orders", "/faults", "/repair"} {
				run("open "+path, chromedp.EmulateViewport(vp.width, vp.height), chromedp.Navigate(site+path),
					chromedp.WaitVisible(chromedp.ID("main")))
				if over := eval(`String(document.documentElement.scrollWidth - window.innerWidth)`); over != "0" {
					t.Errorf("%s %s: the page is %s px wider than the viewport", vp.name, path, over)
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
