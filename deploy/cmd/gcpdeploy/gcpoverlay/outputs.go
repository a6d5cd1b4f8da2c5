// Package gcpoverlay turns the outputs of deploy/terraform/gcp (`terraform
// output -json`) into what deploy/k8s/overlays/gcp needs: its settings file,
// its images and namespace, and the database-ownership Job. Nothing is copied
// by hand, so nothing can be copied wrong.
package gcpoverlay

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Outputs are the Terraform outputs the deploy reads (deploy/terraform/gcp/outputs.tf).
type Outputs struct {
	ProjectID      string
	Region         string
	ClusterName    string
	Namespace      string
	NamePrefix     string
	RegistryURL    string
	ConnectionName string
	// Settings is k8s_gcp_settings: the data of the overlay's settings.yaml.
	Settings map[string]string
	// DatabaseUsers and Databases map a service to its IAM database user
	// (the runtime role, owning nothing) and its database.
	DatabaseUsers map[string]string
	Databases     map[string]string
	// MigrateDatabaseUsers maps a service to the IAM database user of its
	// migrate Job, the owner of its database.
	MigrateDatabaseUsers map[string]string
	// OperatorTokenSecrets maps an environment variable to its Secret Manager secret id.
	OperatorTokenSecrets map[string]string
	// DBOwnerServiceAccount is the Google account the ownership Job's proxy connects as.
	DBOwnerServiceAccount string
}

// ParseOutputs reads `terraform output -json` (every output of the module:
// {"<name>": {"value": ..., "type": ..., "sensitive": ...}}) and fails, naming
// the output, when one the deploy needs is missing or empty: an apply that
// did not finish, or a module older than this command.
func ParseOutputs(b []byte) (Outputs, error) {
	var raw map[string]struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return Outputs{}, fmt.Errorf("terraform output -json: %w", err)
	}
	if len(raw) == 0 {
		return Outputs{}, fmt.Errorf("terraform output -json is empty: run terraform apply in deploy/terraform/gcp first")
	}
	var problems []string
	str := func(name string) string {
		var s string
		o, ok := raw[name]
		if !ok {
			problems = append(problems, name+": missing")
			return ""
		}
		if err := json.Unmarshal(o.Value, &s); err != nil || s == "" {
			problems = append(problems, name+": want a non-empty string")
		}
		return s
	}
	// mayBeEmpty are the values an output map may leave empty.
	strMap := func(name string, mayBeEmpty ...string) map[string]string {
		var m map[string]string
		o, ok := raw[name]
		if !ok {
			problems = append(problems, name+": missing")
			return nil
		}
		if err := json.Unmarshal(o.Value, &m); err != nil || len(m) == 0 {
			problems = append(problems, name+": want a non-empty map of strings")
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if m[k] == "" && !slices.Contains(mayBeEmpty, k) {
				problems = append(problems, fmt.Sprintf("%s[%q]: empty", name, k))
			}
		}
		return m
	}
	o := Outputs{
		ProjectID:      str("project_id"),
		Region:         str("region"),
		ClusterName:    str("cluster_name"),
		Namespace:      str("namespace"),
		NamePrefix:     str("name_prefix"),
		RegistryURL:    str("registry_url"),
		ConnectionName: str("sql_instance_connection_name"),
		// No var.operators: only the console and break-glass operate.
		Settings:              strMap("k8s_gcp_settings", "AUTH_OPERATORS"),
		DatabaseUsers:         strMap("database_users"),
		Databases:             strMap("databases"),
		MigrateDatabaseUsers:  strMap("migrate_database_users"),
		OperatorTokenSecrets:  strMap("operator_token_secrets"),
		DBOwnerServiceAccount: str("db_owner_service_account"),
	}
	for svc := range o.DatabaseUsers {
		if _, ok := o.Databases[svc]; !ok {
			problems = append(problems, fmt.Sprintf("database_users has %q, databases does not", svc))
		}
	}
	for svc := range o.Databases {
		if _, ok := o.DatabaseUsers[svc]; !ok {
			problems = append(problems, fmt.Sprintf("databases has %q, database_users does not", svc))
		}
		if _, ok := o.MigrateDatabaseUsers[svc]; !ok && o.MigrateDatabaseUsers != nil {
			problems = append(problems, fmt.Sprintf("databases has %q, migrate_database_users does not", svc))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return Outputs{}, fmt.Errorf("terraform outputs of deploy/terraform/gcp: %s", strings.Join(problems, "; "))
	}
	return o, nil
}

// Get returns one output as text: a string as is, a map's values one per
// line in key order (for shell loops over secrets or databases).
func (o Outputs) Get(name string) (string, error) {
	strs := map[string]string{
		"project_id": o.ProjectID, "region": o.Region, "cluster_name": o.ClusterName,
		"namespace": o.Namespace, "name_prefix": o.NamePrefix, "registry_url": o.RegistryURL,
		"sql_instance_connection_name": o.ConnectionName, "db_owner_service_account": o.DBOwnerServiceAccount,
		"sql_instance_name": o.InstanceName(),
	}
	if s, ok := strs[name]; ok {
		return s, nil
	}
	lists := map[string]map[string]string{
		"database_users": o.DatabaseUsers, "databases": o.Databases, "operator_token_secrets": o.OperatorTokenSecrets,
		"migrate_database_users": o.MigrateDatabaseUsers,
	}
	if m, ok := lists[name]; ok {
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(m)) {
			b.WriteString(m[k] + "\n")
		}
		return strings.TrimSuffix(b.String(), "\n"), nil
	}
	return "", fmt.Errorf("unknown output %q", name)
}

// InstanceName is the Cloud SQL instance's name, the last part of its
// connection name (<project>:<region>:<instance>).
func (o Outputs) InstanceName() string {
	return o.ConnectionName[strings.LastIndex(o.ConnectionName, ":")+1:]
}
