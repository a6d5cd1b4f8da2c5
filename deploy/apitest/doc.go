// Package apitest runs a real Kubernetes API server for tests: etcd and
// kube-apiserver on loopback, no controller-manager, no scheduler, no nodes.
// An object the server accepts has passed the validation, defaulting and
// admission a cluster would run on `kubectl apply`; nothing is scheduled or
// reconciled. Its test applies both overlays of deploy/k8s server-side.
//
// The binaries: etcd from Debian's etcd-server (/usr/bin/etcd), and
// kube-apiserver built from k8s.io/kubernetes by build-kube-apiserver.sh into
// .cache/kube-apiserver/<KUBE_VERSION> (`make kube-apiserver`; .ci/run does it).
package apitest
