package loadgen_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
)

// fakeAPI answers the two calls loadgen makes: every create gets a new id,
// every order is already invoiced.
func fakeAPI(t *testing.T, created *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			fmt.Fprintf(w, `{"workOrder":{"id":"o-%d"}}`, created.Add(1))
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/work-orders/") {
			fmt.Fprint(w, `{"workOrder":{"status":"WORK_ORDER_STATUS_INVOICED","createTime":"2026-01-01T00:00:00Z","updateTime":"2026-01-01T00:00:01.5Z"}}`)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRun_StopEndsAnOpenLoopRunEarlyAndAwaitsWhatWasCreated(t *testing.T) {
	var created atomic.Int64
	stop := make(chan struct{})
	done := make(chan *loadgen.Result, 1)
	go func() {
		res, err := loadgen.Run(context.Background(), loadgen.Config{BaseURL: fakeAPI(t, &created), Rate: 50, Duration: time.Hour, Stop: stop})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	for created.Load() < 5 {
		select {
		case res := <-done:
			t.Fatalf("run ended before Stop: %+v", res)
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(stop)
	select {
	case res := <-done:
		if res == nil || res.Created < 5 || res.Invoiced != res.Created || int64(res.Created) != created.Load() {
			t.Fatalf("result %+v, %d created: want every created order awaited and invoiced", res, created.Load())
		}
		if want := loadgen.Millis(1500 * time.Millisecond); res.LatencyP50 != want || res.LatencyMax != want {
			t.Fatalf("latency p50 %v max %v, want %v: update_time − create_time", res.LatencyP50, res.LatencyMax, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an hour-long open-loop run did not end within 30 s of Stop")
	}
}
