# What the Kubernetes gcp overlay needs (deploy/k8s/overlays/gcp).

output "k8s_gcp_settings" {
  description = "The data of deploy/k8s/overlays/gcp/settings.yaml, key for key: terraform output -json k8s_gcp_settings."
  value = {
    PROJECT_ID               = var.project_id
    INSTANCE_CONNECTION_NAME = google_sql_database_instance.main.connection_name
    NAME_PREFIX              = var.name_prefix
    CLUSTER_NAME             = google_container_cluster.main.name
    CLUSTER_LOCATION         = google_container_cluster.main.location
    # Each service's audience (callers.tf), and its callers' (PROVIDER_AUDIENCE
    # of workorder, WORKORDER_AUDIENCE and BILLING_AUDIENCE of the console).
    WORKORDER_AUDIENCE = local.audiences["workorder"]
    BILLING_AUDIENCE   = local.audiences["billing"]
    PROVIDER_AUDIENCE  = local.audiences["provider-sim"]
    # Who may call (docs/adr/0025), by Google account email.
    # The console reads every customer's invoices (billing's public API).
    AUTH_CLIENTS = join(",", concat([for name, customers in var.clients : "${google_service_account.client[name].email}=${customers}"],
    ["${google_service_account.service["console"].email}=*"]))
    AUTH_OPERATORS           = join(",", var.operators)
    AUTH_CONSOLES            = google_service_account.service["console"].email
    PROVIDER_ALLOWED_CALLERS = google_service_account.service["workorder"].email
  }
}

output "client_service_accounts" {
  description = "Google service account email per client of var.clients (AUTH_CLIENTS): mint ID tokens as it for a service's audience."
  value       = { for name, sa in google_service_account.client : name => sa.email }
}

output "audiences" {
  description = "The audience (AUTH_AUDIENCE) of each service: callers mint their Google ID tokens for it."
  value       = local.audiences
}

output "name_prefix" {
  description = "Prefix of the operator-token secrets (<name_prefix>-<variable in kebab case>)."
  value       = var.name_prefix
}

output "project_id" {
  value = var.project_id
}

output "region" {
  value = var.region
}

output "cluster_name" {
  description = "gcloud container clusters get-credentials <cluster_name> --region <region>"
  value       = google_container_cluster.main.name
}

output "registry_url" {
  description = "Image prefix: <registry_url>/<service>:<tag>."
  value       = "${google_artifact_registry_repository.images.location}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}

output "sql_instance_connection_name" {
  description = "<project>:<region>:<instance>, for the Cloud SQL Auth Proxy or connector (--private-ip --auto-iam-authn)."
  value       = google_sql_database_instance.main.connection_name
}

output "sql_private_ip" {
  value = google_sql_database_instance.main.private_ip_address
}

output "namespace" {
  description = "The services' namespace: deploy/k8s/overlays/gcp/kustomization.yaml's namespace must be the same."
  value       = var.namespace
}

output "service_accounts" {
  description = "Google service account email per service: the iam.gke.io/gcp-service-account annotation of the service's Kubernetes ServiceAccount."
  value       = { for name, sa in google_service_account.service : name => sa.email }
}

output "database_users" {
  description = "PostgreSQL user per service (IAM authentication; no password): the runtime role, owning nothing (migrate grants it)."
  value       = { for name, u in google_sql_user.service : name => u.name }
}

output "migrate_service_accounts" {
  description = "Google service account email per service with a database, of its migrate Job (Kubernetes ServiceAccount <namespace>/<service>-migrate)."
  value       = { for name, sa in google_service_account.migrate : name => sa.email }
}

output "migrate_database_users" {
  description = "PostgreSQL user per service of its migrate Job (IAM authentication): owns the service's database and grants the service's user (database_users)."
  value       = { for name, u in google_sql_user.migrate : name => u.name }
}

output "databases" {
  description = "Database per service."
  value       = { for name, db in google_sql_database.service : name => db.name }
}

output "operator_token_secrets" {
  description = "Secret Manager secret id per environment variable (add a version with gcloud, README.md)."
  value       = { for env, s in google_secret_manager_secret.operator_token : env => s.secret_id }
}

output "db_owner_service_account" {
  description = "Google service account of the database-ownership Job's Cloud SQL Auth Proxy (Kubernetes ServiceAccount <namespace>/db-owner; make deploy-gcp)."
  value       = google_service_account.db_owner.email
}
