package deploytest

import (
	"os"
	"testing"

	"github.com/lossless-dev/lossless/deploy/internal/kyamlschema"
)

func TestMain(m *testing.M) {
	kyamlschema.Load()
	os.Exit(m.Run())
}
