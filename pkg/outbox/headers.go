package outbox

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// decodeHeaders decodes the headers column, a flat JSON object of strings
// as PostgreSQL prints jsonb ({"k": "v", ...}). The relay decodes one per
// event on its hot path, where encoding/json's reflection was a fifth of
// the relay's CPU; this reads the common shape directly and hands anything
// else (escapes, non-string values, malformed input) to encoding/json, so
// the result is always what json.Unmarshal would give.
func decodeHeaders(b []byte) (map[string]string, error) {
	if h, ok := decodeFlatObject(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	return h, nil
}

var errNotFlat = errors.New("not a flat object of plain strings")

// decodeFlatObject reports false unless b is an object whose keys and values
// are strings without escapes.
func decodeFlatObject(b []byte) (map[string]string, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	h := make(map[string]string, 4)
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return h, skipSpace(b, i+1) == len(b)
	}
	for {
		k, j, err := plainString(b, i)
		if err != nil {
			return nil, false
		}
		j = skipSpace(b, j)
		if j >= len(b) || b[j] != ':' {
			return nil, false
		}
		v, j, err := plainString(b, skipSpace(b, j+1))
		if err != nil {
			return nil, false
		}
		h[k] = v
		j = skipSpace(b, j)
		switch {
		case j < len(b) && b[j] == ',':
			i = skipSpace(b, j+1)
		case j < len(b) && b[j] == '}':
			return h, skipSpace(b, j+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainString reads a JSON string starting at b[i] that has no escapes, no
// control characters and only valid UTF-8 (which encoding/json would
// replace), and returns it and the index after its closing quote.
func plainString(b []byte, i int) (string, int, error) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, errNotFlat
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !utf8.Valid(b[i+1 : j]) {
				return "", 0, errNotFlat
			}
			return string(b[i+1 : j]), j + 1, nil
		case c == '\\' || c < 0x20:
			return "", 0, errNotFlat
		}
	}
	return "", 0, errNotFlat
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
