package main

import _ "embed"

// declaration is this service's service.json, and only this service's: its
// `provision` command creates the topics the declaration says it publishes
// and its subscriptions. The tools that need every service's declaration read
// them from the checkout (internal/devtools/declared).
//
//go:embed service.json
var declaration []byte
