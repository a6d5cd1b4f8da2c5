package permanent_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/lossless-dev/lossless/pkg/permanent"
)

func TestMark(t *testing.T) {
	if permanent.Mark(nil) != nil {
		t.Fatal("Mark(nil) must be nil")
	}
	err := permanent.Mark(io.ErrUnexpectedEOF)
	if !permanent.Is(err) || !permanent.Is(fmt.Errorf("dispatch: %w", err)) {
		t.Fatal("a marked error, wrapped or not, must be permanent")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || err.Error() != io.ErrUnexpectedEOF.Error() {
		t.Fatal("marking must keep the cause and its message")
	}
	if permanent.Is(io.ErrUnexpectedEOF) || permanent.Is(nil) {
		t.Fatal("an unmarked error is transient")
	}
}

func ExampleMark() {
	decode := func([]byte) error { return permanent.Mark(errors.New("payload is not JSON")) }
	err := decode([]byte("<html>"))
	fmt.Println(permanent.Is(err), err)
	// Output: true payload is not JSON
}
