# One secret per operator token a service reads (topology.json
# "operator_tokens": the variables a service.json's local_env sets to
# {operator_token}), named <name_prefix>-<variable in kebab case>, e.g.
# lossless-workorder-operator-token. Terraform creates the secret and its
# access grant, never a version: the token is added with gcloud (README.md),
# so it is in no Terraform state or plan.
#
# Only the owning service's account may read it. On GKE, External Secrets
# reads it as that service: deploy/k8s/overlays/gcp has one SecretStore per
# service, authenticated with the service's Kubernetes ServiceAccount
# (Workload Identity, iam.tf), so the External Secrets controller itself
# holds no Google identity and no secret grant.
resource "google_secret_manager_secret" "operator_token" {
  for_each = local.operator_tokens

  secret_id = "${var.name_prefix}-${each.value.secret_id}"
  labels = {
    service = each.value.service
  }

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_iam_member" "operator_token" {
  for_each = local.operator_tokens

  secret_id = google_secret_manager_secret.operator_token[each.key].id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.service[each.value.service].member
}
