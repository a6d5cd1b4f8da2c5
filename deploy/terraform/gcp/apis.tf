locals {
  # compute and servicenetworking: the VPC and Cloud SQL's private IP;
  # iamcredentials: GKE Workload Identity exchanges tokens through it;
  # cloudresourcemanager: project-level IAM members (iam.tf).
  apis = [
    "pubsub.googleapis.com",
    "sqladmin.googleapis.com",
    "container.googleapis.com",
    "artifactregistry.googleapis.com",
    "secretmanager.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "monitoring.googleapis.com",
    "logging.googleapis.com",
    "cloudtrace.googleapis.com",
    "compute.googleapis.com",
    "servicenetworking.googleapis.com",
    "cloudresourcemanager.googleapis.com",
  ]
}

resource "google_project_service" "api" {
  for_each = toset(local.apis)

  service = each.key
  # Other workloads of the project may use the same APIs; a destroy of this
  # module must not switch them off.
  disable_on_destroy = false
}
