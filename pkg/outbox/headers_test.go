package outbox

import (
	"encoding/json"
	"maps"
	"testing"
)

// decodeHeaders must agree with encoding/json on every input: the fast path
// only skips reflection, it never changes the result.
func FuzzDecodeHeadersMatchesEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{}`, ` { } `, `{"correlation_id": "c-1", "traceparent": "00-4bf9-01"}`,
		`{"a":"b","c":"d"}`, `{"a": "\u003c\"x\""}`, `{"a": 1}`, `{"a": "b",}`, `{"a" "b"}`,
		`{"a": "b"} x`, `[]`, `null`, `{"a": "\xff"}`, `{"a": "b", "a": "c"}`, `{"é": "ü"}`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := decodeHeaders(b)
		var want map[string]string
		wantErr := json.Unmarshal(b, &want)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json %v", b, gotErr, wantErr)
		}
		if gotErr == nil && !maps.Equal(got, want) {
			t.Fatalf("%q: %v, encoding/json %v", b, got, want)
		}
	})
}
