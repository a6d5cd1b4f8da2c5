// Command gcpdeploy turns `terraform output -json` of deploy/terraform/gcp
// into what `make deploy-gcp` applies, so no value is copied by hand:
//
//	gcpdeploy render -outputs outputs.json -overlay <copy of deploy/k8s>/overlays/gcp -tag <tag> -ownership-job job.yaml
//	    writes the overlay's settings.yaml (output k8s_gcp_settings), sets its
//	    namespace and its images (<registry_url>/<service>:<tag>), and writes
//	    the database-ownership Job;
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
		return errors.New("usage: gcpdeploy render|get -outputs <file of terraform output -json> [flags]")
	}
	fs := flag.NewFlagSet("gcpdeploy "+args[0], flag.ContinueOnError)
	outputs := fs.String("outputs", "", "file holding `terraform output -json` of deploy/terraform/gcp (- for stdin)")
	switch args[0] {
	case "render":
		overlay := fs.String("overlay", "", "the gcp overlay directory to render into (a copy: it is edited in place)")
		tag := fs.String("tag", "", "image tag of every service")
		job := fs.String("ownership-job", "", "file to write the database-ownership Job to")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *overlay == "" || *tag == "" || *job == "" {
			return errors.New("render needs -outputs, -overlay, -tag and -ownership-job")
		}
		o, err := readOutputs(*outputs)
		if err != nil {
			return err
		}
		if err := gcpoverlay.Render(*overlay, o, *tag); err != nil {
			return err
		}
		b, err := gcpoverlay.OwnershipJob(o, *overlay)
		if err != nil {
			return err
		}
		return os.WriteFile(*job, b, 0o644)
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
		return fmt.Errorf("unknown command %q: render or get", args[0])
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
