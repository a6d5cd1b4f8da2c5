package envconfig

import (
	"strings"
	"testing"
	"time"
)

func TestErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	r := FromMap(map[string]string{"A_TIMEOUT": "soon", "A_COUNT": "x"})
	if d := r.Duration("A_TIMEOUT", time.Second); d != time.Second {
		t.Errorf("default not kept on error: %v", d)
	}
	r.Int("A_COUNT", 1)
	r.Required("A_URL")
	err := r.Err()
	for _, name := range []string{"A_TIMEOUT", "A_COUNT", "A_URL"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error %v does not name %s", err, name)
		}
	}
}

func TestDefaultsAndValues(t *testing.T) {
	t.Parallel()
	r := FromMap(map[string]string{"B_RATE": "0.5", "B_ON": "true"})
	if r.Float("B_RATE", 0) != 0.5 || !r.Bool("B_ON", false) || r.String("B_MISSING", "d") != "d" {
		t.Fatal("values not read")
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
}
