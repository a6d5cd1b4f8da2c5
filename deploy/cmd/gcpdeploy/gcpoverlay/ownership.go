package gcpoverlay

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"
)

// The ownership Job's names: the Kubernetes ServiceAccount is what
// deploy/terraform/gcp binds to output db_owner_service_account (iam.tf,
// "<namespace>/db-owner"); the Secret holds the postgres password make
// deploy-gcp sets for the Job and deletes after it.
const (
	OwnershipName  = "db-owner"
	PasswordSecret = "db-owner-postgres"
	PsqlImage      = "postgres:15.18-alpine" // the instance's major version (sql.tf); pinned as compose and the local overlay pin it
	psqlUID        = 70                      // the postgres user of the alpine image
	proxyPatchFile = "cloud-sql-proxy.yaml"
	proxyContainer = "cloud-sql-proxy"
)

// OwnershipSQL hands each service's database to its migrate IAM user, as
// the built-in postgres user (a member of cloudsqlsuperuser, not a
// superuser: it must be granted a role before it may give that role a
// database or take objects from it). Idempotent: run again, it changes
// nothing. Without it the service's migrate Job cannot create its schema
// (PostgreSQL 15 lets only a database's owner create in public).
func OwnershipSQL(o Outputs) string {
	var b strings.Builder
	for _, svc := range slices.Sorted(maps.Keys(o.Databases)) {
		user, mig, db := quoteIdent(o.DatabaseUsers[svc]), quoteIdent(o.MigrateDatabaseUsers[svc]), quoteIdent(o.Databases[svc])
		fmt.Fprintf(&b, "-- %s\nGRANT %s TO postgres;\nGRANT %s TO postgres;\nALTER DATABASE %s OWNER TO %s;\n", svc, user, mig, db, mig)
	}
	return b.String()
}

// ReassignSQL, run in a service's database, gives what the service's own
// user owns there (its tables, from a deployment older than the migrate
// users) to the migrate user: the service's user becomes the runtime role,
// which owns nothing, and its migrate grants it what it may do.
func ReassignSQL(o Outputs, svc string) string {
	return fmt.Sprintf("REASSIGN OWNED BY %s TO %s;", quoteIdent(o.DatabaseUsers[svc]), quoteIdent(o.MigrateDatabaseUsers[svc]))
}

// ownershipCommand is psql running OwnershipSQL in database postgres, then
// ReassignSQL in each service's database (REASSIGN OWNED reaches only the
// current database). Each -c is its own transaction: --single-transaction
// would not survive \connect, and every step is idempotent.
func ownershipCommand(o Outputs) []string {
	cmd := []string{"psql", "-v", "ON_ERROR_STOP=1", "-c", OwnershipSQL(o)}
	for _, svc := range slices.Sorted(maps.Keys(o.Databases)) {
		cmd = append(cmd, "-c", `\connect `+quoteIdent(o.Databases[svc]), "-c", ReassignSQL(o, svc))
	}
	return cmd
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// OwnershipJob returns the ServiceAccount and the Job that run OwnershipSQL and ReassignSQL
// through the Cloud SQL Auth Proxy, with the proxy image of the overlay in
// dir (its cloud-sql-proxy.yaml). The proxy connects as
// output db_owner_service_account (cloudsql.client on the instance only) and
// leaves the login to psql: postgres with the password in Secret
// PasswordSecret. The pod meets the namespace's restricted Pod Security.
func OwnershipJob(o Outputs, overlayDir string) ([]byte, error) {
	proxyImage, err := proxyImageOf(filepath.Join(overlayDir, proxyPatchFile))
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		"app.kubernetes.io/name":    OwnershipName,
		"app.kubernetes.io/part-of": "lossless",
		// A database step before the services start, as the migrate Jobs.
		"app.kubernetes.io/component": "migrate",
	}
	meta := metav1.ObjectMeta{Name: OwnershipName, Namespace: o.Namespace, Labels: labels}
	sa := corev1.ServiceAccount{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: OwnershipName, Namespace: o.Namespace, Labels: labels,
			Annotations: map[string]string{"iam.gke.io/gcp-service-account": o.DBOwnerServiceAccount}},
		AutomountServiceAccountToken: new(false),
	}
	restricted := func(uid int64) *corev1.SecurityContext {
		sc := &corev1.SecurityContext{
			RunAsNonRoot:             new(true),
			AllowPrivilegeEscalation: new(false),
			ReadOnlyRootFilesystem:   new(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
		if uid != 0 {
			sc.RunAsUser = &uid
		}
		return sc
	}
	res := func(cpu, mem, memLimit string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memLimit)},
		}
	}
	job := batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: meta,
		Spec: batchv1.JobSpec{
			BackoffLimit:          new(int32(4)),
			ActiveDeadlineSeconds: new(int64(600)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:           OwnershipName,
					AutomountServiceAccountToken: new(false),
					RestartPolicy:                corev1.RestartPolicyOnFailure,
					EnableServiceLinks:           new(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   new(true),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					InitContainers: []corev1.Container{{
						Name:          proxyContainer,
						Image:         proxyImage,
						RestartPolicy: new(corev1.ContainerRestartPolicyAlways),
						// No --auto-iam-authn: psql logs in as postgres with its password.
						Args: []string{"--private-ip", "--structured-logs", "--port=5432",
							"--health-check", "--http-address=0.0.0.0", "--http-port=9801", "--exit-zero-on-sigterm",
							o.ConnectionName},
						Ports: []corev1.ContainerPort{{Name: "proxy-health", ContainerPort: 9801}},
						StartupProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/startup", Port: intstr.FromString("proxy-health")}},
							PeriodSeconds:    1,
							FailureThreshold: 60,
						},
						Resources:       res("50m", "32Mi", "128Mi"),
						SecurityContext: restricted(0),
					}},
					Containers: []corev1.Container{{
						Name:    "psql",
						Image:   PsqlImage,
						Command: ownershipCommand(o),
						Env: []corev1.EnvVar{
							{Name: "PGHOST", Value: "127.0.0.1"},
							{Name: "PGPORT", Value: "5432"},
							{Name: "PGDATABASE", Value: "postgres"},
							{Name: "PGUSER", Value: "postgres"},
							// The proxy's tunnel to the instance is TLS.
							{Name: "PGSSLMODE", Value: "disable"},
							{Name: "PGPASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
								LocalObjectReference: corev1.LocalObjectReference{Name: PasswordSecret}, Key: "password"}}},
							{Name: "HOME", Value: "/tmp"},
						},
						VolumeMounts:    []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
						Resources:       res("50m", "64Mi", "128Mi"),
						SecurityContext: restricted(psqlUID),
					}},
					Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
	var out bytes.Buffer
	out.WriteString("# Written by deploy/cmd/gcpdeploy: the database-ownership step (deploy/terraform/gcp/README.md).\n")
	for i, obj := range []any{sa, job} {
		b, err := sigsyaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes(), nil
}

// proxyImageOf reads the Cloud SQL Auth Proxy image from the overlay's
// sidecar patch, so the Job runs the proxy version the services do.
func proxyImageOf(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var ops []struct {
		Value []struct {
			Name  string `json:"name"`
			Image string `json:"image"`
		} `json:"value"`
	}
	if err := sigsyaml.Unmarshal(b, &ops); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	for _, op := range ops {
		for _, c := range op.Value {
			if c.Name == proxyContainer && c.Image != "" {
				return c.Image, nil
			}
		}
	}
	return "", fmt.Errorf("%s: no %s container with an image", file, proxyContainer)
}
