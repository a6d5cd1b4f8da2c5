variable "project_id" {
  description = "GCP project that holds everything (Pub/Sub, Cloud SQL, GKE, Artifact Registry, Secret Manager)."
  type        = string
}

variable "region" {
  description = "Region of the cluster, the Cloud SQL instance, the registry and the subnet."
  type        = string
  default     = "europe-west1"
}

variable "name_prefix" {
  description = "Prefix of the named infrastructure (cluster, Cloud SQL instance <prefix>-pg, registry, node service account, operator-token secrets). The services' accounts are named after the services alone (iam.tf)."
  type        = string
  default     = "lossless"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,14}$", var.name_prefix))
    error_message = "name_prefix: lowercase letters, digits and dashes, starting with a letter, 2 to 15 characters."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of the services, as deploy/k8s/overlays/gcp's kustomization.yaml sets it; one Kubernetes ServiceAccount per service, named after the service, is bound to its Google service account."
  type        = string
  default     = "lossless"
}

variable "deletion_protection" {
  description = "Protects the Cloud SQL instance (Terraform and API level) and the GKE cluster from deletion. Set false, apply, then destroy to tear down."
  type        = bool
  default     = true
}

variable "subnet_cidr" {
  description = "Primary range of the cluster's subnet (nodes)."
  type        = string
  default     = "10.10.0.0/20"
}

variable "pods_cidr" {
  description = "Secondary range for pods (Autopilot allocates per node from it)."
  type        = string
  default     = "10.16.0.0/14"
}

variable "services_cidr" {
  description = "Secondary range for Kubernetes Services."
  type        = string
  default     = "10.20.0.0/20"
}

# Empty by default: the endpoint then accepts any address, and every request
# still needs a Google identity with rights on the cluster. Set your own
# address (terraform.tfvars.example says how) to narrow it. The documentation
# ranges of RFC 5737 are refused: an example value copied as is would lock
# kubectl out of the cluster with no error until the first kubectl call.
variable "master_authorized_networks" {
  description = "CIDR blocks allowed to reach the cluster's public control-plane endpoint (kubectl, CI, make deploy-gcp). Empty: no restriction beyond authentication."
  type = list(object({
    cidr_block   = string
    display_name = string
  }))
  default = []

  validation {
    condition     = alltrue([for n in var.master_authorized_networks : can(cidrhost(n.cidr_block, 0))])
    error_message = "master_authorized_networks: each cidr_block must be an IPv4 CIDR, e.g. \"198.18.7.4/32\" for one address."
  }
  validation {
    condition = alltrue([for n in var.master_authorized_networks :
      !contains(["192.0.2.0", "198.51.100.0", "203.0.113.0"], try(cidrhost("${split("/", n.cidr_block)[0]}/24", 0), ""))
    ])
    error_message = "master_authorized_networks: 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24 are documentation ranges (RFC 5737) that no real client comes from: set your own address (curl -s https://checkip.amazonaws.com)/32, or leave the list empty."
  }
}

variable "sql_tier" {
  description = "Cloud SQL machine type. db-custom-2-7680 (2 vCPU, 7.5 GB) carries the default max_connections below."
  type        = string
  default     = "db-custom-2-7680"
}

variable "sql_availability_type" {
  description = "REGIONAL (a standby in another zone, automatic failover) or ZONAL (half the price, no failover)."
  type        = string
  default     = "REGIONAL"

  validation {
    condition     = contains(["REGIONAL", "ZONAL"], var.sql_availability_type)
    error_message = "sql_availability_type: REGIONAL or ZONAL."
  }
}

# One instance serves every service. deploy/k8s/base at its highest, as
# docs/production.md ("Database connections") counts it: each Deployment at
# its HPA maxReplicas (or replicas) plus its rolling-update surge (maxSurge 1),
# times the pool caps its env sets (DATABASE_API_MAX_CONNS,
# DATABASE_WORKER_MAX_CONNS; provider-sim pkg/pgdb's 20) plus its dedicated
# session connections (LISTEN, outbox dispatch journal):
#   workorder-api     (6+1) × (10 + 4)     =  98
#   workorder-worker  (2+1) × (12 + 4)     =  48
#   billing-api       (6+1) × ( 5 + 4)     =  63
#   billing-worker    (2+1) × (16 + 3)     =  57
#   provider-sim      (1+1) × 20           =  40
#   3 migrate Jobs × 2 (goose's lock + its connection) = 6
#   operator sessions (psql, CLIs)         =  10
#   total 322, + 3 reserved for superusers = 325, rounded up to 330.
# deploy/deploytest/k8s_terraform_test.go recomputes this from the rendered
# overlay and fails when the default no longer covers it: raising a pool, a
# replica count or an HPA maximum means raising this too. db-custom-2-7680
# (7.5 GB) carries 330 mostly idle connections; a smaller tier needs smaller
# pools or HPA maxima, not just a lower value here.
variable "sql_max_connections" {
  description = "PostgreSQL max_connections of the shared instance: every Deployment of deploy/k8s at its HPA maximum plus surge, times its pool caps and session connections, plus migrate Jobs, operator sessions and 3 superuser slots (see the comment above)."
  type        = number
  default     = 330
}

variable "sql_backup_retained_count" {
  description = "Number of daily automated backups kept."
  type        = number
  default     = 14
}

variable "sql_pitr_days" {
  description = "Days of write-ahead log kept for point-in-time recovery (1 to 7 on the Enterprise edition)."
  type        = number
  default     = 7
}

# Who may call the public APIs and the admin listeners (docs/adr/0025): the
# overlay's AUTH_CLIENTS and AUTH_OPERATORS, rendered from output
# k8s_gcp_settings.
variable "clients" {
  description = "Client service accounts to create, account id suffix => the customers it may act for (\"*\": every customer, a trusted intake such as the demo; else cust-a|cust-b). Each becomes <name_prefix>-<key>@<project>.iam.gserviceaccount.com in AUTH_CLIENTS."
  type        = map(string)
  default     = { demo = "*" }
}

variable "operators" {
  description = "Emails of the operators (people or service accounts) whose own Google ID tokens the admin listeners accept: AUTH_OPERATORS. Empty: only the console and the break-glass operator token."
  type        = list(string)
  default     = []
}
