#!/usr/bin/env bash
# make demo-kind / make demo-gcp: the demo (cmd/demo) as Job demo inside the
# cluster of kubectl's current context, with its own identity: no
# port-forward, no credentials of yours beyond kubectl's (and terraform
# output's on GCP).
#
#   run.sh local   the local overlay's cluster (kind, minikube), namespace
#                  lossless: the demo is the local issuer's client demo
#                  (local/generate-secrets.sh copies its secret).
#   run.sh gcp     GKE: namespace, demo client account and workorder's
#                  audience from `terraform output` of TF_DIR; the image is
#                  the running workorder's, with demo for workorder (make
#                  deploy-gcp pushes both under one tag), or DEMO_IMAGE.
#
# It renders the variant with ARGS into $BUILD (the committed variants stay
# the example), deletes the previous Job, applies the demo's ServiceAccount,
# Secret and NetworkPolicies, then the Job, and waits until it completes or
# fails (at most TIMEOUT seconds), printing its log, the demo's summary. The
# exit status is the Job's.
#
# Environment (Makefile defaults):
#   BUILD       where the render goes (bin/demo-local, bin/gcp/demo)
#   ARGS        cmd/demo's flags instead of the Job's "-n 20 -wait 5m", split
#               on spaces, e.g. "-n 50 -wait 8m" (at most the Job's
#               activeDeadlineSeconds, 10 minutes, in all)
#   TIMEOUT     seconds to wait for the Job (default 720)
#   TF_DIR      gcp: where terraform apply ran (deploy/terraform/gcp)
#   DEMO_IMAGE  gcp: the demo image, instead of the one derived from workorder's
set -euo pipefail
cd "$(dirname "$0")/../../.."

variant="${1:-}"
BUILD="${BUILD:-bin/demo-$variant}"
ARGS="${ARGS:-}"
TIMEOUT="${TIMEOUT:-720}"
TF_DIR="${TF_DIR:-deploy/terraform/gcp}"

die() { printf 'demo-%s: %s\n' "$variant" "$*" >&2; exit 1; }
command -v kubectl >/dev/null 2>&1 || die "kubectl is not on PATH"

case "$variant" in
local)
  namespace=lossless
  sh deploy/k8s/demo/local/generate-secrets.sh
  ;;
gcp)
  command -v terraform >/dev/null 2>&1 || die "terraform is not on PATH (it reads the outputs of $TF_DIR)"
  namespace="$(terraform -chdir="$TF_DIR" output -raw namespace)" ||
    die "no terraform output in $TF_DIR: run terraform apply and make deploy-gcp first"
  account="$(terraform -chdir="$TF_DIR" output -json client_service_accounts | sed -n 's/.*"demo": *"\([^"]*\)".*/\1/p')"
  audience="$(terraform -chdir="$TF_DIR" output -json audiences | sed -n 's/.*"workorder": *"\([^"]*\)".*/\1/p')"
  [ -n "$account" ] || die "terraform output client_service_accounts has no demo (variable clients): Terraform binds the demo's Workload Identity only for it"
  [ -n "$audience" ] || die "terraform output audiences has no workorder"
  image="${DEMO_IMAGE:-}"
  if [ -z "$image" ]; then
    wo="$(kubectl -n "$namespace" get deploy -l app.kubernetes.io/name=workorder \
      -o jsonpath='{.items[0].spec.template.spec.containers[?(@.name=="workorder")].image}')" ||
      die "cannot read workorder's Deployment in namespace $namespace (make deploy-gcp first)"
    case "$wo" in
    */workorder:*) image="${wo%/workorder:*}/demo:${wo##*/workorder:}" ;;
    *) die "workorder runs $wo, not <registry>/workorder:<tag>: set DEMO_IMAGE" ;;
    esac
  fi
  # Deployed without the tls-cert-manager component: no CA to trust,
  # workorder serves plain HTTP.
  tls=1
  if ! kubectl -n "$namespace" get secret workorder-tls >/dev/null 2>&1; then
    tls=0
    echo "demo-gcp: no Secret workorder-tls (deployed without the tls-cert-manager component): plain HTTP"
  fi
  ;;
*)
  die "usage: run.sh local|gcp"
  ;;
esac

# A copy of deploy/k8s/demo and a kustomization on top of the variant: the
# namespace, image and identity (gcp) and the arguments.
mkdir -p "$BUILD"
BUILD="$(cd "$BUILD" && pwd)"
rm -rf "$BUILD/demo"
cp -R deploy/k8s/demo "$BUILD/demo"
mkdir -p "$BUILD/demo/run"
yq() { printf "'%s'" "${1//\'/\'\'}"; } # a YAML single-quoted scalar
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "namespace: $(yq "$namespace")"
  echo "resources: [../$variant]"
  if [ "$variant" = gcp ]; then
    # The name the gcp variant leaves the image with.
    name="$(sed -n 's|^ *newName: *\(.*/demo\)$|\1|p' deploy/k8s/demo/gcp/kustomization.yaml | head -n1)"
    echo "images:"
    echo "  - name: $name"
    echo "    newName: $(yq "${image%:*}")"
    echo "    newTag: $(yq "${image##*:}")"
  fi
  echo "patches:"
  echo "  - patch: |-"
  echo "      apiVersion: batch/v1"
  echo "      kind: Job"
  echo "      metadata:"
  echo "        name: demo"
  echo "      spec:"
  echo "        template:"
  echo "          spec:"
  echo "            containers:"
  echo "              - name: demo"
  if [ -n "$ARGS" ]; then
    echo "                args:"
    set -f # split on spaces, no globbing
    for a in $ARGS; do echo "                  - $(yq "$a")"; done
    set +f
  fi
  if [ "$variant" = gcp ]; then
    echo "                env:"
    echo "                  - name: WORKORDER_AUDIENCE"
    echo "                    value: $(yq "$audience")"
    if [ "$tls" = 0 ]; then
      echo "                  - name: WORKORDER_URL"
      echo "                    value: http://workorder:8080"
      echo "                  - name: WORKORDER_ADMIN_URL"
      echo "                    value: http://workorder:8180"
      echo "                  - name: TLS_CA_FILE"
      echo "                    \$patch: delete"
      echo "                volumeMounts:"
      echo "                  - mountPath: /etc/lossless/tls"
      echo "                    \$patch: delete"
      echo "            volumes:"
      echo "              - name: ca"
      echo "                \$patch: delete"
    fi
    echo "  - target: {kind: ServiceAccount, name: demo}"
    echo "    patch: |-"
    echo "      - op: replace"
    echo "        path: /metadata/annotations/iam.gke.io~1gcp-service-account"
    echo "        value: $(yq "$account")"
  fi
} >"$BUILD/demo/run/kustomization.yaml"
kubectl kustomize "$BUILD/demo/run" >"$BUILD/manifests.yaml"
# The Job apart, applied last: its pod starts under the egress policies
# that let it reach its token source.
awk -v job="$BUILD/job.yaml" -v rest="$BUILD/rest.yaml" '
  /^---$/ { flush(); next } { doc = doc $0 "\n"; if ($0 == "kind: Job") isjob = 1 }
  function flush() { if (doc != "") printf "---\n%s", doc > (isjob ? job : rest); doc = ""; isjob = 0 }
  END { flush() }' "$BUILD/manifests.yaml"
[ -s "$BUILD/job.yaml" ] || die "the render $BUILD/manifests.yaml has no Job"

echo "demo-$variant: Job demo in namespace $namespace ($(sed -n 's/^ *image: //p' "$BUILD/job.yaml"))"
# A Job's template is immutable, and a finished one would only be reported again.
kubectl -n "$namespace" delete job demo --ignore-not-found --wait=true
kubectl apply -f "$BUILD/rest.yaml"
kubectl apply -f "$BUILD/job.yaml"

# Until the Job is Complete or Failed: `kubectl wait` waits for one
# condition and would sit out its timeout on the other.
deadline=$((SECONDS + TIMEOUT))
state=""
while :; do
  state="$(kubectl -n "$namespace" get job demo -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}')"
  case "$state" in *Complete* | *Failed*) break ;; esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    state="timeout"
    break
  fi
  sleep 3
done

echo "---- log of job/demo"
kubectl -n "$namespace" logs job/demo --tail=-1 || true
case "$state" in
*Complete*)
  echo "demo-$variant: Job demo completed: every order invoiced"
  ;;
*)
  kubectl -n "$namespace" describe job demo || true
  kubectl -n "$namespace" describe pod -l job-name=demo | tail -n 40 || true
  what="failed"
  [ "$state" != timeout ] || what="did not finish within $TIMEOUT s"
  hint="deploy/k8s/README.md, \"Local: kind or minikube\""
  [ "$variant" = local ] || hint="docs/deploy-gcp.md, \"When a step fails\""
  die "Job demo $what: its log and state are above ($hint)"
  ;;
esac
