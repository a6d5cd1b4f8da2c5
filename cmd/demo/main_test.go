package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// -faults sends the knobs as PUT /v1/faults's body and the audit's ticket
// (-ticket) and actor as its query parameters, with the operator token; a
// refusal is an error carrying the provider's answer.
func TestFaultsArePutWithTheTicketAndActor(t *testing.T) {
	var got struct {
		method, path, ticket, actor, auth string
		body                              map[string]any
	}
	refuse := false
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.auth = r.Method, r.URL.Path, r.Header.Get("Authorization")
		got.ticket, got.actor = r.URL.Query().Get("authorization.ticket"), r.URL.Query().Get("authorization.actor")
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &got.body); err != nil {
			t.Errorf("body %q: %v", b, err)
		}
		if refuse {
			http.Error(w, `{"code":3,"message":"authorization.ticket is required"}`, http.StatusBadRequest)
		}
	}))
	t.Cleanup(ts.Close)

	knobs, err := parseFaults("duplicate=0.2,extra_delay=1s")
	if err != nil {
		t.Fatal(err)
	}
	if err := putFaults(context.Background(), ts.Client(), ts.URL, "tok", "INC 7&x", knobs); err != nil {
		t.Fatal(err)
	}
	if got.method != http.MethodPut || got.path != "/v1/faults" || got.auth != "Bearer tok" ||
		got.ticket != "INC 7&x" || got.actor != demoActor || got.body["duplicate"] != 0.2 || got.body["extra_delay"] != "1s" {
		t.Fatalf("request %+v", got)
	}
	refuse = true
	if err := putFaults(context.Background(), ts.Client(), ts.URL, "tok", "", knobs); err == nil || !strings.Contains(err.Error(), "authorization.ticket") {
		t.Fatalf("refused: %v, want the provider's answer", err)
	}
}
