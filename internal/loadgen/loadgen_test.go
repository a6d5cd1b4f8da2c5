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

	"github.com/lossless-dev/lossless/internal/loadgen"
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
		if strings.HasSuffix(r.URL.Path, "/history") {
			fmt.Fprint(w, `{"transitions":[{"toStatus":"WORK_ORDER_STATUS_CREATED","time":"2026-01-01T00:00:00Z"},{"toStatus":"WORK_ORDER_STATUS_INVOICED","time":"2026-01-01T00:00:01Z"}]}`)
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
	case <-time.After(30 * time.Second):
		t.Fatal("an hour-long open-loop run did not end within 30 s of Stop")
	}
}
