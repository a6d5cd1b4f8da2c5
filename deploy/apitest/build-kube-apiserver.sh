#!/usr/bin/env bash
# Builds kube-apiserver KUBE_VERSION from the Go module proxy into
# .cache/kube-apiserver/<version>/kube-apiserver, once per version (a second
# run finds the binary and exits). k8s.io/kubernetes cannot be `go install`ed:
# its go.mod replaces every k8s.io staging module with a directory of its own
# tree, so a throwaway module requires it and points each staging module at
# its published v0.<minor>.<patch> instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
KUBE_VERSION="${KUBE_VERSION:?KUBE_VERSION (e.g. v1.34.4)}"
out=".cache/kube-apiserver/$KUBE_VERSION"
# A second cache outside the checkout, shared by every clone on the machine
# (a CI run starts from a clean clone): KUBE_APISERVER_CACHE, default the
# user's cache directory.
shared="${KUBE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lossless/kube-apiserver}/$KUBE_VERSION"
if [ -x "$out/kube-apiserver" ]; then
  echo "kube-apiserver $KUBE_VERSION: cached in $out"
  exit 0
fi
if [ -x "$shared/kube-apiserver" ]; then
  mkdir -p "$out"
  cp "$shared/kube-apiserver" "$out/kube-apiserver"
  echo "kube-apiserver $KUBE_VERSION: copied from the machine's cache $shared"
  exit 0
fi
staging="v0.${KUBE_VERSION#v1.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
{
  echo "module kubeapiserverbuild"
  echo "go $(go env GOVERSION | sed 's/^go//')"
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  # Every "k8s.io/x => ./staging/src/k8s.io/x" of kubernetes' go.mod.
  sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|replace \1 => \1 '"$staging"'|p' "$mod"
} >"$tmp/go.mod"
printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$tmp/tools.go"
echo "kube-apiserver $KUBE_VERSION: building into $out (staging modules $staging)"
start=$(date +%s)
(cd "$tmp" && GOFLAGS=-mod=mod go mod tidy) || { echo "kube-apiserver $KUBE_VERSION: go mod tidy of the build module failed"; exit 1; }
mkdir -p "$out.tmp"
(cd "$tmp" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$OLDPWD/$out.tmp/kube-apiserver" \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" \
  k8s.io/kubernetes/cmd/kube-apiserver)
rm -rf "$out" && mv "$out.tmp" "$out"
if mkdir -p "$shared" 2>/dev/null && cp "$out/kube-apiserver" "$shared/kube-apiserver.tmp" 2>/dev/null; then
  mv "$shared/kube-apiserver.tmp" "$shared/kube-apiserver"
fi
echo "kube-apiserver $KUBE_VERSION: built in $(( $(date +%s) - start ))s"
