package pgtext_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// unescape reverses pgtext's escape (the test's proof that it loses nothing).
func unescape(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			out = append(out, s[i])
			continue
		}
		switch s[i+1] {
		case '\\':
			out = append(out, '\\')
			i++
		case 'x':
			v, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
			if err != nil {
				panic(err)
			}
			out = append(out, byte(v))
			i += 3
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}

func FuzzStorable(f *testing.F) {
	for _, s := range []string{"", "plain", "a\x00b", "\xff", `back\slash`, `\x00`, "é\xc3", "\\\x00\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := pgtext.Storable(s)
		if strings.ContainsRune(got, 0) || !utf8.ValidString(got) {
			t.Fatalf("Storable(%q) = %q is not storable", s, got)
		}
		if pgtext.Problem(s) == "" {
			if got != s {
				t.Fatalf("storable %q changed to %q", s, got)
			}
			return
		}
		if back := unescape(got); back != s {
			t.Fatalf("round trip of %q: escaped %q, back %q", s, got, back)
		}
	})
}

func FuzzStorableMap(f *testing.F) {
	f.Add("k", "v", "k2", "v2")
	f.Add("k\x00", "v", "k\\x00", "w")
	f.Add("a", "\xff", "b", "\x00")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		in := map[string]string{k1: v1, k2: v2}
		out, escaped := pgtext.StorableMap(in)
		if len(escaped) == 0 && len(out) != len(in) {
			t.Fatalf("nothing escaped but %v became %v", in, out)
		}
		for k, v := range out {
			if pgtext.Problem(k) != "" || pgtext.Problem(v) != "" {
				t.Fatalf("not storable: %q=%q", k, v)
			}
		}
		if len(out) != len(in) {
			t.Fatalf("attributes lost: %v -> %v", in, out)
		}
	})
}
