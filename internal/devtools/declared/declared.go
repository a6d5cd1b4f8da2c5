// Package declared reads every services/<name>/service.json of the checkout
// (internal/catalog): the whole system, for the tools that run or provision
// all of it — `make run` (cmd/runlocal, internal/devtools/localstack), the
// Pub/Sub emulator's -provision, deploy/terraform/gcp/topology.json
// (internal/topology's test) — and for tests that need every service's
// topics. It is the one place that aggregates the declarations: a service
// binary embeds only its own (services/<name>/service.go), so no production
// code depends on another service's declaration.
package declared

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// Dir is the folder holding one folder per service, relative to the root.
const Dir = "services"

// Root returns the checkout's root: the nearest directory at or above dir
// with a go.mod and a services folder next to it. Tools run from the root;
// tests run from their package's folder, below it.
func Root(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if isFile(filepath.Join(d, "go.mod")) && isDir(filepath.Join(d, Dir)) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("declared: no go.mod with a %s folder next to it at or above %s", Dir, dir)
		}
	}
}

// Load parses every declaration under root's services folder.
func Load(root string) (catalog.Catalog, error) {
	return catalog.Load(filepath.Join(root, Dir))
}

// Catalog parses the declarations of the checkout holding the working
// directory.
func Catalog() (catalog.Catalog, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := Root(wd)
	if err != nil {
		return nil, err
	}
	return Load(root)
}

// Topology is the whole system's Pub/Sub topology (Catalog().Topology()):
// what every service's `provision` together creates.
func Topology() (pubsub.Topology, error) {
	c, err := Catalog()
	if err != nil {
		return pubsub.Topology{}, err
	}
	return c.Topology(), nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
