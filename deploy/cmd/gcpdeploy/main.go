// Command gcpdeploy turns `terraform output -json` of deploy/terraform/gcp
// into what `make deploy-gcp` applies, so no value is copied by hand:
//
//	gcpdeploy render -outputs outputs.json -overlay <copy of deploy/k8s>/overlays/gcp -tag <tag> -ownership-job job.yaml [-components "<name> ..."]
//	    writes the overlay's settings.yaml (output k8s_gcp_settings), sets its
//	    namespace and its images (<registry_url>/<service>:<tag>), keeps only
//	    the kustomize components named by -components (all when the flag is
//	    absent; deploy/k8s/components), and writes the database-ownership Job;
//	gcpdeploy components -overlay <overlay>
//	    prints the names of the components the overlay composes, one per line;
//	gcpdeploy get -outputs outputs.json <output>
//	    prints one output (a map: its values, one per line), for the shell.
//
// render edits the overlay in place: run it on a copy (make deploy-gcp
// copies deploy/k8s under bin/), so the committed overlay stays the example.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"

	"github.com/lossless-dev/lossless/deploy/cmd/gcpdeploy/gcpoverlay"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gcpdeploy:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: gcpdeploy render|get -outputs <file of terraform output -json> [flags], or gcpdeploy components -overlay <dir>")
	}
	fs := flag.NewFlagSet("gcpdeploy "+args[0], flag.ContinueOnError)
	outputs := fs.String("outputs", "", "file holding `terraform output -json` of deploy/terraform/gcp (- for stdin)")
	switch args[0] {
	case "render":
		overlay := fs.String("overlay", "", "the gcp overlay directory to render into (a copy: it is edited in place)")
		tag := fs.String("tag", "", "image tag of every service")
		job := fs.String("ownership-job", "", "file to write the database-ownership Job to")
		components := fs.String("components", "", "the overlay's components to keep, separated by spaces or commas (absent: all; empty: none)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		selected := false
		fs.Visit(func(f *flag.Flag) { selected = selected || f.Name == "components" })
		if *overlay == "" || *tag == "" || *job == "" {
			return errors.New("render needs -outputs, -overlay, -tag and -ownership-job")
		}
		o, err := readOutputs(*outputs)
		if err != nil {
			return err
		}
		if selected {
			keep := strings.FieldsFunc(*components, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
			if err := gcpoverlay.SelectComponents(*overlay, keep); err != nil {
				return err
			}
		}
		if err := gcpoverlay.Render(*overlay, o, *tag); err != nil {
			return err
		}
		b, err := gcpoverlay.OwnershipJob(o, *overlay)
		if err != nil {
			return err
		}
		return os.WriteFile(*job, b, 0o644)
	case "components":
		overlay := fs.String("overlay", "", "the overlay directory")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *overlay == "" {
			return errors.New("components needs -overlay")
		}
		names, err := gcpoverlay.Components(*overlay)
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, err := fmt.Fprintln(stdout, n); err != nil {
				return err
			}
		}
		return nil
	case "get":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("usage: gcpdeploy get -outputs <file> <output>")
		}
		o, err := readOutputs(*outputs)
		if err != nil {
			return err
		}
		v, err := o.Get(fs.Arg(0))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, v)
		return err
	default:
		return fmt.Errorf("unknown command %q: render, components or get", args[0])
	}
}

func readOutputs(file string) (gcpoverlay.Outputs, error) {
	var (
		b   []byte
		err error
	)
	switch file {
	case "":
		return gcpoverlay.Outputs{}, errors.New("-outputs: the file `terraform output -json` wrote (- for stdin)")
	case "-":
		b, err = io.ReadAll(os.Stdin)
	default:
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return gcpoverlay.Outputs{}, err
	}
	return gcpoverlay.ParseOutputs(b)
}
