package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// What the new service's Deployments (k8s.yaml.tmpl) open at most, as
// docs/production.md ("Database connections") counts it; keep these and
// the template's pool caps, replicas and HPA maximum together
// (deploy/deploytest recomputes the sum from the rendered overlay).
const (
	apiPools        = 5 + 4 // DATABASE_API_MAX_CONNS + DATABASE_WORKER_MAX_CONNS
	apiHighest      = 6 + 1 // HPA maxReplicas + maxSurge
	apiSteady       = 2     // HPA minReplicas
	workerPool      = 8     // DATABASE_WORKER_MAX_CONNS
	workerDedicated = 1 + 2 // the outbox relay's LISTEN + its dispatch journal (BatchesInFlight 2)
	workerHighest   = 2 + 1 // replicas + maxSurge
	workerSteady    = 2
	migrateConns    = 2 // goose's session lock + the migration's connection
	superuserSlots  = 3 // superuser_reserved_connections
)

// addedHighest and addedSteady are the connections the new service adds
// at its highest and in steady state.
const (
	addedHighest = apiHighest*apiPools + workerHighest*(workerPool+workerDedicated) + migrateConns
	addedSteady  = apiSteady*apiPools + workerSteady*(workerPool+workerDedicated)
)

// Files that state the connection budget.
const (
	productionDoc = "docs/production.md"
	tfVariables   = "deploy/terraform/gcp/variables.tf"
	tfVarsExample = "deploy/terraform/gcp/terraform.tfvars.example"
	tfReadme      = "deploy/terraform/gcp/README.md"
	k8sReadme     = "deploy/k8s/README.md"
)

// newMaxConnections is sql_max_connections once totalHighest connections
// (before the new service) grow by addedHighest: the old value when it
// still covers them, else the sum with the superuser slots rounded up to
// ten.
func newMaxConnections(totalHighest, old int) int {
	need := totalHighest + addedHighest + superuserSlots
	return max(old, (need+9)/10*10)
}

// connectionEdits recompute what depends on the number of services: the
// connection budget of docs/production.md, Terraform's sql_max_connections
// (its default, the sum in its comment, the example tfvars, the README) and
// deploy/k8s's README.
func connectionEdits(n Names) []edit {
	limit := 0 // variables.tf's new default, for the example tfvars after it
	return []edit{
		{productionDoc, productionDocEdit(n)},
		{recordedOutputs, recordedOutputsEdit(n)},
		{tfVariables, func(s string) (string, error) {
			var total, oldLimit int
			s, err := renumber(s, `#   total (\d+), \+ 3 reserved for superusers = (\d+), rounded up to (\d+)\.`, func(v []int) []int {
				total, oldLimit = v[0], v[2]
				t := v[0] + addedHighest
				return []int{t, t + superuserSlots, newMaxConnections(v[0], v[2])}
			})
			if err != nil {
				return "", err
			}
			rows := fmt.Sprintf("#   %-17s (%d+1) × (%2d + %d)     = %3d\n#   %-17s (%d+1) × (%2d + %d)     = %3d\n",
				n.Name+"-api", apiHighest-1, apiPools-4, 4, apiHighest*apiPools,
				n.Name+"-worker", workerHighest-1, workerPool, workerDedicated, workerHighest*(workerPool+workerDedicated))
			re := regexp.MustCompile(`(?m)^#   (\d+) migrate Jobs × 2 \(goose's lock \+ its connection\) = (\d+)$`)
			loc := re.FindStringIndex(s)
			if loc == nil {
				return "", fmt.Errorf("no match for %s", re)
			}
			s = s[:loc[0]] + rows + s[loc[0]:]
			if s, err = renumber(s, re.String(), func(v []int) []int { return []int{v[0] + 1, (v[0] + 1) * migrateConns} }); err != nil {
				return "", err
			}
			limit = newMaxConnections(total, oldLimit)
			if s, err = renumber(s, `(?s)variable "sql_max_connections" \{.*?default\s*=\s*(\d+)`, func([]int) []int { return []int{limit} }); err != nil {
				return "", err
			}
			return renumber(s, `carries (\d+) mostly idle`, func([]int) []int { return []int{limit} })
		}},
		{tfVarsExample, func(s string) (string, error) {
			// The example's value is checked against the sum too: raise it
			// to the new default when it falls short.
			return renumber(s, `(?m)^sql_max_connections\s*=\s*(\d+)`, func(v []int) []int { return []int{max(v[0], limit)} })
		}},
		{tfReadme, func(s string) (string, error) {
			return renumber(s, "\\| `sql_max_connections` \\| `(\\d+)` \\|.*? plus (\\d+) migrate Jobs, .*?superuser slots: (\\d+) \\(", func(v []int) []int {
				total := v[2] - superuserSlots
				return []int{newMaxConnections(total, v[0]), v[1] + 1, total + addedHighest + superuserSlots}
			})
		}},
		{k8sReadme, func(s string) (string, error) {
			return renumber(s, "(?s)can hold (\\d+) connections.*?`sql_max_connections` defaults to (\\d+)", func(v []int) []int {
				return []int{v[0] + addedHighest, newMaxConnections(v[0], v[1])}
			})
		}},
	}
}

// productionDocEdit adds the new service's rows to docs/production.md's
// table of what each role opens and to its worked example, and recomputes
// the example's totals and the max_connections they need.
func productionDocEdit(n Names) func(string) (string, error) {
	return func(s string) (string, error) {
		roles := fmt.Sprintf("| %s `api` | API pool (%d) + workers' pool (%d): readiness and operator RPCs | none |\n"+
			"| %s `worker` | workers' pool, %d (the outbox relay, the consumer, the markers' cleaner) | 1 LISTEN of the outbox relay + journal pool of `%sOUTBOX_BATCHES_IN_FLIGHT` (2) = **%d** |\n",
			n.Name, apiPools-4, 4, n.Name, workerPool, n.EnvPrefix, workerDedicated)
		s, err := insertBefore("| `migrate` Job |", roles)(s)
		if err != nil {
			return "", err
		}
		deployments := fmt.Sprintf("| %s-api | API %d, workers %d | %d | %d × %d = %d | %d × %d = %d |\n"+
			"| %s-worker | workers %d | %d + %d = %d | %d × %d = %d | %d × %d = %d |\n",
			n.Name, apiPools-4, 4, apiPools, apiSteady, apiPools, apiSteady*apiPools, apiHighest, apiPools, apiHighest*apiPools,
			n.Name, workerPool, workerPool, workerDedicated, workerPool+workerDedicated,
			workerSteady, workerPool+workerDedicated, workerSteady*(workerPool+workerDedicated),
			workerHighest, workerPool+workerDedicated, workerHighest*(workerPool+workerDedicated))
		migrate := regexp.MustCompile(`(?m)^\| (\d+) migrate Jobs \| \| 2 \| \| \+(\d+) \|$`)
		loc := migrate.FindStringIndex(s)
		if loc == nil {
			return "", fmt.Errorf("no match for %s", migrate)
		}
		s = s[:loc[0]] + deployments + s[loc[0]:]
		if s, err = renumber(s, migrate.String(), func(v []int) []int { return []int{v[0] + 1, (v[0] + 1) * migrateConns} }); err != nil {
			return "", err
		}
		var total int
		if s, err = renumber(s, `(?m)^\| \*\*total\*\* \| \| \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|$`, func(v []int) []int {
			total = v[1]
			return []int{v[0] + addedSteady, v[1] + addedHighest}
		}); err != nil {
			return "", err
		}
		if s, err = renumber(s, "`max_connections` ≥ (\\d+)", func([]int) []int { return []int{total + addedHighest + superuserSlots} }); err != nil {
			return "", err
		}
		return renumber(s, "`sql_max_connections` defaults to (\\d+)", func(v []int) []int { return []int{newMaxConnections(total, v[0])} })
	}
}

// renumber replaces the numbers the groups of pattern's first match
// capture with what f computes from them.
func renumber(s, pattern string, f func([]int) []int) (string, error) {
	re := regexp.MustCompile(pattern)
	loc := re.FindStringSubmatchIndex(s)
	if loc == nil {
		return "", fmt.Errorf("no match for %s", pattern)
	}
	olds := make([]int, 0, len(loc)/2-1)
	for i := 2; i < len(loc); i += 2 {
		v, err := strconv.Atoi(s[loc[i]:loc[i+1]])
		if err != nil {
			return "", err
		}
		olds = append(olds, v)
	}
	news := f(olds)
	var b strings.Builder
	prev := 0
	for i, v := range news {
		b.WriteString(s[prev:loc[2+2*i]])
		b.WriteString(strconv.Itoa(v))
		prev = loc[3+2*i]
	}
	b.WriteString(s[prev:])
	return b.String(), nil
}

// recordedOutputs is a recorded `terraform output -json` of
// deploy/terraform/gcp that deploy/cmd/gcpdeploy's tests render the gcp
// overlay from, and check against the module's outputs.
const recordedOutputs = "deploy/deploytest/testdata/terraform-output.json"

// recordedOutputsEdit adds what the module now outputs for the new service:
// its Google account, its database and IAM database user, its migration
// account and user, its operator token's secret and its audience. Terraform writes the file with sorted keys and
// two-space indents, as json.MarshalIndent does.
func recordedOutputsEdit(n Names) func(string) (string, error) {
	return func(s string) (string, error) {
		type output struct {
			Sensitive bool `json:"sensitive"`
			Type      any  `json:"type"`
			Value     any  `json:"value"`
		}
		var outs map[string]*output
		if err := json.Unmarshal([]byte(s), &outs); err != nil {
			return "", err
		}
		str := func(name string) (string, error) {
			if o, ok := outs[name]; ok {
				if v, ok := o.Value.(string); ok {
					return v, nil
				}
			}
			return "", fmt.Errorf("no string output %q", name)
		}
		project, err := str("project_id")
		if err != nil {
			return "", err
		}
		prefix, err := str("name_prefix")
		if err != nil {
			return "", err
		}
		namespace, err := str("namespace")
		if err != nil {
			return "", err
		}
		for name, v := range map[string][2]string{
			"service_accounts":         {n.Name, n.Name + "@" + project + ".iam.gserviceaccount.com"},
			"databases":                {n.Name, n.Ident},
			"database_users":           {n.Name, n.Name + "@" + project + ".iam"},
			"migrate_service_accounts": {n.Name, n.Name + "-migrate@" + project + ".iam.gserviceaccount.com"},
			"migrate_database_users":   {n.Name, n.Name + "-migrate@" + project + ".iam"},
			"operator_token_secrets":   {n.EnvPrefix + "OPERATOR_TOKEN", prefix + "-" + n.Name + "-operator-token"},
			"audiences":                {n.Name, "https://" + n.Name + "." + namespace + ".svc"},
		} {
			o, ok := outs[name]
			if !ok {
				return "", fmt.Errorf("no output %q", name)
			}
			value, ok1 := o.Value.(map[string]any)
			typ, ok2 := o.Type.([]any)
			if !ok1 || !ok2 || len(typ) != 2 {
				return "", fmt.Errorf("output %q is not an object", name)
			}
			attrs, ok := typ[1].(map[string]any)
			if !ok {
				return "", fmt.Errorf("output %q is not an object", name)
			}
			value[v[0]], attrs[v[0]] = v[1], "string"
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(outs); err != nil {
			return "", err
		}
		return b.String(), nil
	}
}
