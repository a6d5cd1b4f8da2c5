# Autopilot: Google manages the nodes; Workload Identity is always on (pool
# <project>.svc.id.goog), which iam.tf binds each service's Kubernetes
# ServiceAccount through.
resource "google_container_cluster" "main" {
  name                = var.name_prefix
  location            = var.region
  enable_autopilot    = true
  deletion_protection = var.deletion_protection

  network    = google_compute_network.main.id
  subnetwork = google_compute_subnetwork.gke.id

  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }

  # Nodes without external IPs; the control plane keeps a public endpoint,
  # narrowed by master_authorized_networks when set.
  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = false
  }

  dynamic "master_authorized_networks_config" {
    for_each = length(var.master_authorized_networks) == 0 ? [] : [var.master_authorized_networks]
    content {
      dynamic "cidr_blocks" {
        for_each = master_authorized_networks_config.value
        content {
          cidr_block   = cidr_blocks.value.cidr_block
          display_name = cidr_blocks.value.display_name
        }
      }
    }
  }

  release_channel {
    channel = "REGULAR"
  }

  # Nodes run as a minimal service account instead of the Compute Engine
  # default one (project Editor in many projects).
  cluster_autoscaling {
    auto_provisioning_defaults {
      service_account = google_service_account.nodes.email
      oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    }
  }

  depends_on = [google_project_service.api, google_project_iam_member.nodes]
}

resource "google_service_account" "nodes" {
  account_id   = "${var.name_prefix}-nodes"
  display_name = "GKE nodes of ${var.name_prefix}"

  depends_on = [google_project_service.api]
}

resource "google_project_iam_member" "nodes" {
  project = var.project_id
  role    = "roles/container.defaultNodeServiceAccount"
  member  = google_service_account.nodes.member
}

resource "google_artifact_registry_repository_iam_member" "nodes" {
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = google_service_account.nodes.member
}
