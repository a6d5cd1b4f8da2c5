// Command rename gives a fork its own module path: it rewrites the current one
// (read from the root go.mod) everywhere it appears under the repository root.
//
//	go run ./cmd/rename -module github.com/acme/orders    (make rename MODULE=...)
//
// What it rewrites, in every text file except under .git:
//   - the module path as a path, at element boundaries: go.mod module lines and
//     the sub-modules' requires and replaces, Go imports, tracer names,
//     proto go_package options, lint settings, docs;
//   - the raw descriptors that protoc-gen-go embeds in gen/**/*.pb.go, which
//     carry go_package in protobuf wire format (a text edit would corrupt the
//     length prefixes), so that `make check-generated` stays in sync;
//   - runbook URLs (GitHub blob URLs of this repository): for a module on
//     github.com they point at the new repository; for any other host, whose
//     web layout rename cannot know, they become repository paths
//     (docs/runbooks/x.md), which the deploy tests also accept.
//
// Binary files (a NUL byte or invalid UTF-8) and symbolic links are skipped.
// Every go.mod is written last, so an interrupted run is finished by running
// it again; a run with the current module path changes nothing.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rename:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rename", flag.ContinueOnError)
	module := fs.String("module", "", "the new module path, e.g. github.com/acme/orders")
	root := fs.String("root", ".", "the repository root (the directory of the main go.mod)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *module == "" {
		return fmt.Errorf("-module is required, e.g. -module github.com/acme/orders")
	}
	_, err := Rename(*root, *module, out)
	return err
}
