package retry_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/lossless-dev/lossless/pkg/retry"
)

func TestPermanent(t *testing.T) {
	if retry.Permanent(nil) != nil {
		t.Fatal("Mark(nil) must be nil")
	}
	err := retry.Permanent(io.ErrUnexpectedEOF)
	if !retry.IsPermanent(err) || !retry.IsPermanent(fmt.Errorf("dispatch: %w", err)) {
		t.Fatal("a marked error, wrapped or not, must be permanent")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || err.Error() != io.ErrUnexpectedEOF.Error() {
		t.Fatal("marking must keep the cause and its message")
	}
	if retry.IsPermanent(io.ErrUnexpectedEOF) || retry.IsPermanent(nil) {
		t.Fatal("an unmarked error is transient")
	}
}

func ExamplePermanent() {
	decode := func([]byte) error { return retry.Permanent(errors.New("payload is not JSON")) }
	err := decode([]byte("<html>"))
	fmt.Println(retry.IsPermanent(err), err)
	// Output: true payload is not JSON
}
