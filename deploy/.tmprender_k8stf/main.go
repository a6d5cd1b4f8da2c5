package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	b, _ := m.AsYaml()
	os.Stdout.Write(b)
}
