package leasequeue

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A failed attempt's message is cut to fit last_error; a cut inside a
// multi-byte character would make qFail fail for the whole batch.
func TestTruncateKeepsValidUTF8(t *testing.T) {
	s := "ab€cd" // € is 3 bytes: indexes 2..4
	for n := range len(s) + 2 {
		got := truncate(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, got) {
			t.Errorf("truncate(%q, %d) = %q", s, n, got)
		}
	}
	if got := truncate(s, 4); got != "ab" {
		t.Errorf("truncate inside a rune = %q, want %q", got, "ab")
	}
}
