resource "google_compute_network" "main" {
  name                    = var.name_prefix
  auto_create_subnetworks = false

  depends_on = [google_project_service.api]
}

# Nodes have private IPs only; Private Google Access lets them pull from
# Artifact Registry and reach Google APIs (Pub/Sub, Cloud SQL Admin, Secret
# Manager, Trace, Monitoring) without leaving Google's network. Images from
# outside Google's registries (External Secrets Operator on ghcr.io, the
# ownership Job's psql on Docker Hub) go through the Cloud NAT below.
resource "google_compute_subnetwork" "gke" {
  name                     = "${var.name_prefix}-gke"
  region                   = var.region
  network                  = google_compute_network.main.id
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = var.pods_cidr
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = var.services_cidr
  }
}

# Private services access: Cloud SQL gets an IP from this range, reachable
# from the VPC only (the instance has no public IP).
resource "google_compute_global_address" "sql" {
  name          = "${var.name_prefix}-sql-psa"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 20
  network       = google_compute_network.main.id
}

resource "google_service_networking_connection" "sql" {
  network                 = google_compute_network.main.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.sql.name]

  # Google removes the peering with the network; deleting it from the API
  # fails while Cloud SQL still holds an address in the range (it releases it
  # minutes after the instance is gone), which would stop `terraform destroy`.
  deletion_policy = "ABANDON"
}

# Outbound internet for the private nodes (egress only: nothing reaches the
# nodes through it). Without it the first image from outside Google's
# registries sits in ImagePullBackOff: External Secrets never starts, the
# operator-token Secret is never created and no service can start. Addresses
# are allocated automatically; a fixed egress address (for an allow-list at a
# real provider) is nat_ip_allocate_option = "MANUAL_ONLY" with google_compute_address.
resource "google_compute_router" "nat" {
  name    = "${var.name_prefix}-nat"
  region  = var.region
  network = google_compute_network.main.id
}

resource "google_compute_router_nat" "nat" {
  name                               = "${var.name_prefix}-nat"
  router                             = google_compute_router.nat.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  # Nodes and pods of the cluster's subnet; the Services range never
  # originates traffic.
  subnetwork {
    name                     = google_compute_subnetwork.gke.id
    source_ip_ranges_to_nat  = ["PRIMARY_IP_RANGE", "LIST_OF_SECONDARY_IP_RANGES"]
    secondary_ip_range_names = ["pods"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}
