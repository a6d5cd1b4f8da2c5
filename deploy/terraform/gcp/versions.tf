terraform {
  required_version = ">= 1.6"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 7.0"
    }
    # google_project_service_identity (pubsub.tf) exists only in the beta
    # provider: it creates the Pub/Sub service agent before it is granted.
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "~> 7.0"
    }
  }

  # State lives in a GCS bucket created once by hand (versioned, uniform
  # access): terraform init -backend-config="bucket=<bucket>" -backend-config="prefix=lossless/gcp".
  # State holds resource metadata, never a secret value (see secrets.tf).
  backend "gcs" {}
}

provider "google" {
  project = var.project_id
  region  = var.region
}

provider "google-beta" {
  project = var.project_id
  region  = var.region
}
