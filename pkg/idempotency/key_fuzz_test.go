package idempotency

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseKey: whatever a client puts in the Idempotency-Key header, ParseKey
// either refuses it with ErrInvalidKey (INVALID_ARGUMENT naming the header)
// or returns a key that is stored as is: 1..MaxKeyLen visible ASCII bytes, so
// no NUL, control character or invalid UTF-8 ever reaches the keys table. An
// accepted key parses to itself, bare or quoted, so both header forms name
// one key.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		`"a\"b"`,
		"  padded  ",
		"",
		`""`,
		"nul\x00byte",
		`"nul\u0000escaped"`,
		"bad\xffutf8",
		"tab\tinside",
		strings.Repeat("k", MaxKeyLen),
		strings.Repeat("k", MaxKeyLen+1),
		`"unterminated`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := ParseKey(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("ParseKey(%q) = %v, want an ErrInvalidKey error", raw, err)
			}
			return
		}
		if len(key) == 0 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", raw, len(key))
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
				t.Fatalf("ParseKey(%q) accepted byte 0x%02x at %d", raw, c, i)
			}
		}
		if again, err := ParseKey(key); err != nil || again != key {
			t.Fatalf("bare form of %q parses to %q, %v", key, again, err)
		}
		if quoted, err := ParseKey(strconv.Quote(key)); err != nil || quoted != key {
			t.Fatalf("quoted form of %q parses to %q, %v", key, quoted, err)
		}
	})
}
