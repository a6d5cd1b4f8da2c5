#!/usr/bin/env bash
# make deploy-gcp: from a finished `terraform apply` of deploy/terraform/gcp to
# running services, with every value read from `terraform output -json`
# (docs/deploy-gcp.md walks through each step and what to do when one fails).
#
#   1. reads the outputs and fetches the cluster's credentials;
#   2. adds the operator token to Secret Manager when no secret has one yet;
#   3. builds the service images and the demo's (make demo-gcp runs it as a
#      Job) and pushes them to the project's Artifact Registry (docker
#      buildx, else ko);
#   4. renders deploy/k8s/overlays/gcp for the outputs into $BUILD (gcpdeploy
#      render: settings, namespace, images, the components kept; the committed
#      overlay is untouched);
#   5. installs External Secrets Operator and cert-manager (helm) when they
#      are missing and their component is on (the SecretStores and the
#      Certificates need them);
#   6. hands each database to its service's IAM user: a Job runs the
#      ownership SQL as postgres through the Cloud SQL Auth Proxy, with a
#      password set for the Job and replaced by an unknown one after it;
#   7. applies the overlay, waits for the migrate Jobs and the rollouts, and
#      prints how to reach the services.
#
# Idempotent: run it again to deploy a new commit (new image tag) or to finish
# a run that stopped. Environment (Makefile defaults):
#   TF_DIR       deploy/terraform/gcp, where terraform apply ran
#   BUILD        bin/gcp, the outputs, the rendered overlay and manifests
#   TAG          image tag (default: the commit, plus a timestamp when dirty)
#   SERVICES     the services to build (Makefile's SERVICES)
#   COMPONENTS   the overlay's kustomize components to keep (deploy/k8s/components),
#                e.g. "external-secrets managed-prometheus" for no TLS between
#                the services; unset: all the overlay composes; empty: none
#   ESO_VERSION  External Secrets Operator Helm chart version
#   CERT_MANAGER_VERSION  cert-manager Helm chart version
#   PLATFORM     image platform (linux/amd64: Autopilot's default nodes)
#   GO           go command
set -euo pipefail
cd "$(dirname "$0")/../../.."

TF_DIR="${TF_DIR:-deploy/terraform/gcp}"
BUILD="${BUILD:-bin/gcp}"
SERVICES="${SERVICES:-workorder provider-sim console billing}"
ESO_VERSION="${ESO_VERSION:-1.0.0}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.18.2}"
PLATFORM="${PLATFORM:-linux/amd64}"
GO="${GO:-go}"
if [ -z "${TAG:-}" ]; then
  TAG="$(git rev-parse --short=12 HEAD)"
  git diff --quiet HEAD -- || TAG="$TAG-dirty-$(date -u +%Y%m%d%H%M%S)"
fi

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'deploy-gcp: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not on PATH: $2"; }

need terraform "install Terraform >= 1.6 (deploy/terraform/gcp/README.md)"
need gcloud "install the Google Cloud CLI and run: gcloud auth login && gcloud auth application-default login"
need kubectl "install kubectl (gcloud components install kubectl) and gke-gcloud-auth-plugin"
need helm "install Helm 3 (https://helm.sh/docs/intro/install/): it installs External Secrets Operator and cert-manager"
need openssl "install openssl: it generates the operator token and the one-off postgres password"

mkdir -p "$BUILD"
BUILD="$(cd "$BUILD" && pwd)"
step "terraform outputs ($TF_DIR)"
terraform -chdir="$TF_DIR" output -json >"$BUILD/outputs.json" ||
  die "terraform output failed: run terraform init and terraform apply in $TF_DIR first"
(cd deploy && "$GO" build -o "$BUILD/gcpdeploy" ./cmd/gcpdeploy)
out() { "$BUILD/gcpdeploy" get -outputs "$BUILD/outputs.json" "$1"; }
PROJECT="$(out project_id)"
REGION="$(out region)"
CLUSTER="$(out cluster_name)"
NAMESPACE="$(out namespace)"
REGISTRY="$(out registry_url)"
INSTANCE="$(out sql_instance_name)"
echo "project $PROJECT, cluster $CLUSTER in $REGION, namespace $NAMESPACE, images $REGISTRY/<service>:$TAG"

# wait_jobs WHAT SECONDS JOB...: until every Job completes; stops at the
# first that fails (its last log lines shown), or when SECONDS pass.
# `kubectl wait --for=condition=complete` alone waits out its timeout on a
# Job that already failed.
wait_jobs() {
  local what="$1" minutes=$(($2 / 60)) deadline=$((SECONDS + $2)) job state pending
  shift 2
  [ "$#" -gt 0 ] || die "$what: no Job to wait for"
  while :; do
    pending=0
    for job in "$@"; do
      state="$(kubectl -n "$NAMESPACE" get "$job" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}')"
      case "$state" in
        *Complete*) ;;
        *Failed*)
          kubectl -n "$NAMESPACE" logs "$job" --all-containers --tail=50 >&2 || true
          die "$what: $job failed (its output is above; docs/deploy-gcp.md, \"When a step fails\")" ;;
        *) pending=$((pending + 1)) ;;
      esac
    done
    [ "$pending" -gt 0 ] || return 0
    [ "$SECONDS" -lt "$deadline" ] || {
      kubectl -n "$NAMESPACE" describe "$@" >&2 || true
      die "$what did not finish within $minutes minutes (docs/deploy-gcp.md, \"When a step fails\")"
    }
    sleep 5
  done
}

step "cluster credentials"
gcloud container clusters get-credentials "$CLUSTER" --region "$REGION" --project "$PROJECT"

step "operator tokens (Secret Manager)"
missing=()
present=0
for id in $(out operator_token_secrets); do
  if [ -n "$(gcloud secrets versions list "$id" --project "$PROJECT" --filter='state:ENABLED' --limit=1 --format='value(name)')" ]; then
    present=$((present + 1))
  else
    missing+=("$id")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  # One token for every service (the console forwards one): a service added
  # since the last deploy (make new-service) gets the others' token, a first
  # deploy a new one.
  token=""
  if [ "$present" -gt 0 ]; then
    for id in $(out operator_token_secrets); do
      case " ${missing[*]} " in *" $id "*) continue ;; esac
      token="$(gcloud secrets versions access latest --secret "$id" --project "$PROJECT")" && break
    done
    [ -n "$token" ] || die "could not read the operator token of the services that have one (gcloud secrets versions access)"
  else
    token="$(openssl rand -base64 32)"
  fi
  for id in "${missing[@]}"; do
    printf '%s' "$token" | gcloud secrets versions add "$id" --data-file=- --project "$PROJECT" >/dev/null
    echo "added a version to $id"
  done
  unset token
else
  echo "every secret has a version"
fi

step "images: build and push $TAG"
gcloud auth configure-docker "${REGISTRY%%/*}" --quiet >/dev/null
# demo: the image of make demo-gcp's Job, under the same tag as the services'.
if docker buildx version >/dev/null 2>&1; then
  for s in $SERVICES demo; do
    docker buildx build --platform "$PLATFORM" -f deploy/docker/Dockerfile --target "$s" \
      -t "$REGISTRY/$s:$TAG" --push .
  done
elif command -v ko >/dev/null 2>&1; then
  # The Dockerfile's runtime base; ko names each image after its directory.
  for s in $SERVICES demo; do
    dir="./services/$s"
    [ -d "$dir" ] || dir="./cmd/$s"
    KO_DOCKER_REPO="$REGISTRY" KO_DEFAULTBASEIMAGE="gcr.io/distroless/static-debian12:nonroot" \
      ko build --base-import-paths --platform "$PLATFORM" --tags "$TAG" "$dir" >/dev/null
  done
else
  die "neither docker buildx nor ko is available to build the images: install Docker with the buildx plugin, or ko (go install github.com/google/ko@latest)"
fi

step "render deploy/k8s/overlays/gcp for $PROJECT into $BUILD"
rm -rf "$BUILD/k8s"
cp -R deploy/k8s "$BUILD/k8s"
"$BUILD/gcpdeploy" render -outputs "$BUILD/outputs.json" -overlay "$BUILD/k8s/overlays/gcp" \
  -tag "$TAG" -ownership-job "$BUILD/ownership-job.yaml" ${COMPONENTS+-components "$COMPONENTS"}
# What the rendered overlay composes decides what the cluster needs below.
COMPONENTS=" $("$BUILD/gcpdeploy" components -overlay "$BUILD/k8s/overlays/gcp" | tr '\n' ' ')"
component() { case "$COMPONENTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
echo "components:${COMPONENTS% }"
kubectl kustomize "$BUILD/k8s/overlays/gcp" >"$BUILD/manifests.yaml"
echo "wrote $BUILD/manifests.yaml and $BUILD/ownership-job.yaml"

step "External Secrets Operator $ESO_VERSION"
if ! component external-secrets; then
  echo "component external-secrets is off: not installed; create the Secret lossless-operator-tokens yourself (checked once the namespace exists)"
elif helm status external-secrets -n external-secrets >/dev/null 2>&1; then
  echo "already installed (helm -n external-secrets list); upgrade it on your own schedule"
else
  helm repo add external-secrets https://charts.external-secrets.io >/dev/null 2>&1 || true
  helm repo update external-secrets >/dev/null
  # Requests set: Autopilot bills a container without them at 0.5 vCPU and 2 GiB.
  helm install external-secrets external-secrets/external-secrets -n external-secrets --create-namespace \
    --version "$ESO_VERSION" --set installCRDs=true \
    --set resources.requests.cpu=50m --set resources.requests.memory=128Mi \
    --set webhook.resources.requests.cpu=50m --set webhook.resources.requests.memory=64Mi \
    --set certController.resources.requests.cpu=50m --set certController.resources.requests.memory=128Mi \
    --wait --timeout 10m
fi

step "cert-manager $CERT_MANAGER_VERSION"
# The component tls-cert-manager's Issuers and Certificates: without
# cert-manager's CRDs the API server refuses them (deploy/apitest shows it).
# Not installed when the component is off. Requests set, as for External
# Secrets: the chart requests nothing, and Autopilot bills such a pod at
# 0.5 vCPU and 2 GiB (and sets limits equal to requests: raise them for a
# cluster with many certificates). The leader-election lease in its own
# namespace, as Autopilot denies writes to kube-system.
if ! component tls-cert-manager; then
  echo "component tls-cert-manager is off: not installed; the services talk plaintext to each other (docs/deploy-gcp.md)"
elif helm status cert-manager -n cert-manager >/dev/null 2>&1; then
  echo "already installed (helm -n cert-manager list); upgrade it on your own schedule"
else
  helm repo add jetstack https://charts.jetstack.io >/dev/null 2>&1 || true
  helm repo update jetstack >/dev/null
  helm install cert-manager jetstack/cert-manager -n cert-manager --create-namespace \
    --version "$CERT_MANAGER_VERSION" --set crds.enabled=true \
    --set global.leaderElection.namespace=cert-manager \
    --set resources.requests.cpu=50m --set resources.requests.memory=128Mi \
    --set webhook.resources.requests.cpu=50m --set webhook.resources.requests.memory=64Mi \
    --set cainjector.resources.requests.cpu=50m --set cainjector.resources.requests.memory=128Mi \
    --set startupapicheck.resources.requests.cpu=50m --set startupapicheck.resources.requests.memory=64Mi \
    --wait --timeout 10m
fi

step "namespace $NAMESPACE"
# Only the Namespace (selected by its Pod Security label): the Job below needs it first.
kubectl apply -f "$BUILD/manifests.yaml" -l pod-security.kubernetes.io/enforce
if ! component external-secrets; then
  # Without External Secrets nothing writes it, and no pod starts without it.
  kubectl -n "$NAMESPACE" get secret lossless-operator-tokens >/dev/null 2>&1 ||
    die "component external-secrets is off and namespace $NAMESPACE has no Secret lossless-operator-tokens (a key per service, as ExternalSecret lossless-operator-tokens in deploy/k8s/components/external-secrets has them): create it first (docs/deploy-gcp.md, \"Deploying without TLS or another component\")"
fi

step "database ownership (Job db-owner, as postgres through the Auth Proxy)"
password="$(openssl rand -hex 24)"
gcloud sql users set-password postgres --instance "$INSTANCE" --project "$PROJECT" --password "$password" --quiet >/dev/null
# Through stdin, not the command line (which other local users can list).
printf '%s' "$password" | kubectl -n "$NAMESPACE" create secret generic db-owner-postgres \
  --from-file=password=/dev/stdin --dry-run=client -o yaml | kubectl apply -f - >/dev/null
unset password
kubectl -n "$NAMESPACE" delete job db-owner --ignore-not-found >/dev/null
kubectl apply -f "$BUILD/ownership-job.yaml"
wait_jobs "the ownership Job" 600 job/db-owner
kubectl -n "$NAMESPACE" logs job/db-owner -c psql || true
# The password leaves with the Job: replaced by one nobody knows, the Secret deleted.
kubectl -n "$NAMESPACE" delete secret/db-owner-postgres job/db-owner --ignore-not-found >/dev/null
gcloud sql users set-password postgres --instance "$INSTANCE" --project "$PROJECT" \
  --password "$(openssl rand -hex 24)" --quiet >/dev/null

step "apply"
# Jobs are immutable: the previous release's migrate Jobs go first.
kubectl -n "$NAMESPACE" delete job -l app.kubernetes.io/component=migrate --ignore-not-found
kubectl apply -f "$BUILD/manifests.yaml"

step "wait: migrate Jobs, then the rollouts"
# No provision Jobs on GCP: Terraform created the Pub/Sub topology.
mapfile -t migrate_jobs < <(kubectl -n "$NAMESPACE" get job -l app.kubernetes.io/component=migrate -o name)
wait_jobs "the migrate Jobs" 900 "${migrate_jobs[@]}"
for d in $(kubectl -n "$NAMESPACE" get deploy -o name); do
  kubectl -n "$NAMESPACE" rollout status "$d" --timeout=10m
done

step "deployed $TAG to $PROJECT"
cat <<EOF
The services have no external address (no Ingress: docs/deploy-gcp.md). Reach them through the API server:
  kubectl -n $NAMESPACE port-forward svc/workorder 8080     # REST  http://127.0.0.1:8080/v1/work-orders
  kubectl -n $NAMESPACE port-forward svc/console 8089       # console http://127.0.0.1:8089 (token: gcloud secrets versions access latest --secret $(out name_prefix)-console-operator-token --project $PROJECT)
  kubectl -n $NAMESPACE port-forward svc/provider-sim 8081  # provider fault knobs
Orders end to end, ending with invoices (Job demo in the cluster):  make demo-gcp
EOF
