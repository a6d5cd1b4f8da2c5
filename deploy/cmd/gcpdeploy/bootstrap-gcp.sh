#!/usr/bin/env bash
# make bootstrap-gcp PROJECT_ID=<project> [REGION=<region>]: the one-time
# setup before the first `terraform apply` of deploy/terraform/gcp
# (docs/deploy-gcp.md, "Before you start"), in the order that works on a
# machine that has never used gcloud:
#
#   1. gcloud's project first, so that everything after it, the
#      application-default credentials' quota project included, is this one;
#   2. your gcloud login and the application-default credentials Terraform
#      uses, each only when missing (each opens a browser);
#   3. the APIs of deploy/terraform/gcp/apis.tf, and Cloud Storage and
#      Service Usage, enabled now so that they have propagated by the first
#      apply (Terraform enables the same ones again, a no-op);
#   4. the state bucket gs://<project>-tfstate (versioned, uniform access)
#      when missing;
#   5. deploy/terraform/gcp/terraform.tfvars from terraform.tfvars.example
#      with project_id (and REGION when given) set, when missing; an existing
#      one must name the same project;
#   6. terraform init against the bucket.
#
# Idempotent: run it again after a step failed, or on another machine of the
# same project. It never deletes anything. Environment (Makefile defaults):
#   PROJECT_ID   the Google Cloud project (required; billing enabled)
#   REGION       the bucket's location and terraform.tfvars' region
#                (default: terraform.tfvars', else the example's)
#   TF_DIR       deploy/terraform/gcp
set -euo pipefail
cd "$(dirname "$0")/../../.."

TF_DIR="${TF_DIR:-deploy/terraform/gcp}"
EXAMPLE_PROJECT="my-project"

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'bootstrap-gcp: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not on PATH: $2"; }

PROJECT_ID="${PROJECT_ID:-}"
[ -n "$PROJECT_ID" ] || die "set PROJECT_ID, e.g. make bootstrap-gcp PROJECT_ID=acme-orders-dev"
# Google's rule for project ids: 6 to 30 of [a-z0-9-], a letter first, no
# hyphen last.
[[ "$PROJECT_ID" =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] ||
  die "PROJECT_ID=$PROJECT_ID is not a project id (6 to 30 lowercase letters, digits, hyphens; a letter first)"
[ "$PROJECT_ID" != "$EXAMPLE_PROJECT" ] || die "PROJECT_ID=$EXAMPLE_PROJECT is the example's: name your own project"

need gcloud "install the Google Cloud CLI (docs/deploy-gcp.md, \"Before you start\")"
need terraform "install Terraform >= 1.6 (deploy/terraform/gcp/README.md)"

tfvars="$TF_DIR/terraform.tfvars"
example="$TF_DIR/terraform.tfvars.example"
[ -f "$example" ] || die "$example is missing: run this from a checkout of the repository"
# tfvar NAME FILE: the value of a top-level string setting, or nothing.
tfvar() { sed -n "s/^$1[[:space:]]*=[[:space:]]*\"\([^\"]*\)\".*/\1/p" "$2" | head -n1; }
if [ -f "$tfvars" ]; then
  have="$(tfvar project_id "$tfvars")"
  [ "$have" = "$PROJECT_ID" ] ||
    die "$tfvars sets project_id = \"$have\", not $PROJECT_ID: fix it or move it away, then run again"
  REGION="${REGION:-$(tfvar region "$tfvars")}"
fi
REGION="${REGION:-$(tfvar region "$example")}"
[ -n "$REGION" ] || die "set REGION, e.g. REGION=europe-west1"
BUCKET="gs://$PROJECT_ID-tfstate"

step "gcloud project $PROJECT_ID"
gcloud config set project "$PROJECT_ID"

step "credentials"
if [ -z "$(gcloud auth list --filter=status:ACTIVE --format='value(account)')" ]; then
  gcloud auth login
fi
if ! gcloud auth application-default print-access-token >/dev/null 2>&1; then
  gcloud auth application-default login
fi
# Credentials made earlier for another project bill their API calls there.
gcloud auth application-default set-quota-project "$PROJECT_ID"

step "APIs"
# Read, not copied: a line per API in apis.tf's list. (No mapfile: macOS's
# bash is 3.2.)
apis=()
while IFS= read -r api; do apis+=("$api"); done < <(sed -n 's/^[[:space:]]*"\([a-z0-9]*\.googleapis\.com\)",\{0,1\}$/\1/p' "$TF_DIR/apis.tf")
[ "${#apis[@]}" -gt 0 ] || die "found no API in $TF_DIR/apis.tf"
gcloud services enable --project "$PROJECT_ID" storage.googleapis.com serviceusage.googleapis.com "${apis[@]}"

step "state bucket $BUCKET"
if ! gcloud storage buckets describe "$BUCKET" --project "$PROJECT_ID" >/dev/null 2>&1; then
  gcloud storage buckets create "$BUCKET" --project "$PROJECT_ID" --location "$REGION" --uniform-bucket-level-access
fi
gcloud storage buckets update "$BUCKET" --versioning

step "$tfvars"
if [ -f "$tfvars" ]; then
  echo "kept (project_id = \"$PROJECT_ID\")"
else
  sed -e "s/^project_id\([[:space:]]*\)=.*/project_id\1= \"$PROJECT_ID\"/" \
    -e "s/^region\([[:space:]]*\)=.*/region\1= \"$REGION\"/" "$example" >"$tfvars.tmp"
  [ "$(tfvar project_id "$tfvars.tmp")" = "$PROJECT_ID" ] || die "$example has no project_id line to set"
  mv "$tfvars.tmp" "$tfvars"
  echo "written from $example: project_id = \"$PROJECT_ID\", region = \"$REGION\""
fi

step "terraform init"
terraform -chdir="$TF_DIR" init -input=false \
  -backend-config="bucket=$PROJECT_ID-tfstate" -backend-config="prefix=lossless/gcp"

printf '\nbootstrap-gcp: done. Next: terraform -chdir=%s apply\n' "$TF_DIR"
