#!/bin/sh
# Writes secrets/demo-client.env (git-ignored), the demo client's secret that
# kustomization.yaml's secretGenerator reads, from the local overlay's
# generated issuer clients (../../overlays/local/generate-secrets.sh, run
# before the overlay's first apply). Written on every run, so a rotation of
# the overlay's secrets reaches the demo's.
set -eu

here="$(cd "$(dirname "$0")" && pwd)"
src="${LOCAL_ISSUER_CLIENTS:-$here/../../overlays/local/secrets/localissuer-clients.env}"
[ -f "$src" ] || { echo "$0: $src is missing: run deploy/k8s/overlays/local/generate-secrets.sh and apply the local overlay first" >&2; exit 1; }
secret=$(sed -n 's/^demo=//p' "$src")
[ -n "$secret" ] || { echo "$0: $src has no demo= line (the issuer's demo client)" >&2; exit 1; }
mkdir -p "$here/secrets"
umask 077
printf 'secret=%s\n' "$secret" >"$here/secrets/demo-client.env.tmp"
mv "$here/secrets/demo-client.env.tmp" "$here/secrets/demo-client.env"
