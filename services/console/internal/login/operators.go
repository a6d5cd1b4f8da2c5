// Package login decides who may log in to the console and how often one
// address may fail: the operators file (each operator's name and the
// SHA-256 of their own credential) and a per-address failure limit.
package login

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// NamePattern is an operator's name: what the audit rows' actor says. A
// login, an e-mail address or a service account; no spaces.
var NamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$`)

// Operators maps each operator's name to the SHA-256 of their credential.
// The zero value has no operators.
type Operators struct {
	digests map[string][32]byte
}

// ParseOperators reads an operators file: one operator a line, "name
// sha256-hex" (64 hex digits; `printf %s "$credential" | sha256sum`), blank
// lines and lines starting with # ignored. Errors name the line.
func ParseOperators(r io.Reader) (Operators, error) {
	o := Operators{digests: map[string][32]byte{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return Operators{}, fmt.Errorf("line %d: want \"name sha256-hex\"", n)
		}
		if !NamePattern.MatchString(f[0]) {
			return Operators{}, fmt.Errorf("line %d: operator name %q: want %s", n, f[0], NamePattern)
		}
		b, err := hex.DecodeString(strings.TrimPrefix(f[1], "sha256:"))
		if err != nil || len(b) != sha256.Size {
			return Operators{}, fmt.Errorf("line %d: operator %s: want the credential's SHA-256 as 64 hex digits", n, f[0])
		}
		if _, dup := o.digests[f[0]]; dup {
			return Operators{}, fmt.Errorf("line %d: operator %s listed twice", n, f[0])
		}
		o.digests[f[0]] = [32]byte(b)
	}
	if err := sc.Err(); err != nil {
		return Operators{}, err
	}
	return o, nil
}

// Len is the number of operators.
func (o Operators) Len() int { return len(o.digests) }

// Check reports whether credential is name's, and its digest. The time it
// takes does not depend on whether name exists or on the credential. A
// credential shorter than operator.MinTokenLength never matches.
func (o Operators) Check(name, credential string) ([32]byte, bool) {
	got := sha256.Sum256([]byte(credential))
	want, known := o.digests[name]
	match := subtle.ConstantTimeCompare(got[:], want[:]) == 1
	return got, known && match && len(credential) >= operator.MinTokenLength
}

// Current is name's credential digest now, for a session's check.
func (o Operators) Current(name string) ([32]byte, bool) {
	d, ok := o.digests[name]
	return d, ok
}

// File is an operators file re-read when it changes (a Kubernetes Secret
// volume is updated in place), so removing an operator or changing their
// credential ends their sessions without a restart. Safe for concurrent use.
type File struct {
	path  string
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	ops     Operators
	err     error
	mod     time.Time
	size    int64
	checked time.Time
}

// OpenFile reads path; an unreadable or invalid file is an error.
// Afterwards the file is checked for changes at most once per every.
func OpenFile(path string, every time.Duration, now func() time.Time) (*File, error) {
	if now == nil {
		now = time.Now
	}
	f := &File{path: path, every: every, now: now}
	f.reload()
	if f.err != nil {
		return nil, f.err
	}
	return f, nil
}

// Operators returns the current table. When a changed file cannot be read
// or parsed the table is empty (nobody can log in, every session ends:
// fail closed) and the error says why.
func (f *File) Operators() (Operators, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.now().Sub(f.checked) >= f.every {
		f.reload()
	}
	return f.ops, f.err
}

// reload re-reads the file when its modification time or size changed;
// f.mu is held (or f is not shared yet).
func (f *File) reload() {
	f.checked = f.now()
	st, err := os.Stat(f.path)
	if err != nil {
		f.ops, f.err = Operators{}, fmt.Errorf("operators file: %w", err)
		return
	}
	if f.err == nil && f.ops.digests != nil && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return
	}
	r, err := os.Open(f.path)
	if err != nil {
		f.ops, f.err = Operators{}, fmt.Errorf("operators file: %w", err)
		return
	}
	defer func() { _ = r.Close() }() // read only: nothing to lose
	ops, err := ParseOperators(r)
	if err != nil {
		f.ops, f.err = Operators{}, fmt.Errorf("operators file %s: %w", f.path, err)
		return
	}
	f.ops, f.err, f.mod, f.size = ops, nil, st.ModTime(), st.Size()
}
