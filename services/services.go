// Package services carries the declarations of the services in this folder
// (<name>/service.json, see internal/catalog) into every binary that needs
// the whole system's shape: the `provision` command of each service, the
// Pub/Sub emulator and `make run`. Add a service by adding its folder with a
// declaration (cmd/newservice); nothing here changes.
package services

import (
	"embed"

	"github.com/lossless-dev/lossless/internal/catalog"
)

//go:embed */service.json
var declarations embed.FS

// Catalog parses the embedded declarations.
func Catalog() (catalog.Catalog, error) { return catalog.Parse(declarations) }
