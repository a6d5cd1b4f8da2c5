package deploytest

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestK8sGCPOverlayRunsTLSBetweenServices: in the gcp overlay every
// service's Deployments serve and dial TLS (docs/adr/0018): TLS_CERT_FILE,
// TLS_KEY_FILE and TLS_CA_FILE name files of a mounted Secret that a
// cert-manager Certificate of the namespace's CA writes, valid for the
// Service's name (what callers dial) and localhost/127.0.0.1 (the REST
// gateway's own call), for serving and for client authentication; the
// probes and the scrapes use HTTPS; the console reads the services over
// HTTPS. The local overlay stays plaintext.
func TestK8sGCPOverlayRunsTLSBetweenServices(t *testing.T) {
	t.Parallel()
	r := renderOverlay(t, "gcp")
	certs := map[string]*certificate{} // by Secret name
	for _, c := range all[*certificate](r) {
		certs[c.Spec.SecretName] = c
	}
	issuers := map[string]*certIssuer{}
	for _, i := range all[*certIssuer](r) {
		issuers[i.Metadata.Name] = i
	}
	for _, s := range declaredServices(t) {
		for _, w := range workloads(r) {
			c := appContainer(w)
			if c == nil || w.pod.Labels[labelName] != s.Name || w.kind != "Deployment" {
				continue
			}
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			secret := mountedSecret(w.pod.Spec, c, env["TLS_CERT_FILE"])
			if secret == "" || mountedSecret(w.pod.Spec, c, env["TLS_KEY_FILE"]) != secret || mountedSecret(w.pod.Spec, c, env["TLS_CA_FILE"]) != secret {
				t.Errorf("gcp: %s: TLS_CERT_FILE %q, TLS_KEY_FILE %q, TLS_CA_FILE %q: want files of one mounted Secret",
					w, env["TLS_CERT_FILE"], env["TLS_KEY_FILE"], env["TLS_CA_FILE"])
				continue
			}
			if v, ok := env["TLS_CLIENT_AUTH"]; ok && v != "require" {
				t.Errorf("gcp: %s: TLS_CLIENT_AUTH %q: gRPC must require client certificates", w, v)
			}
			cert := certs[secret]
			if cert == nil {
				t.Errorf("gcp: %s mounts Secret %s, which no Certificate writes", w, secret)
				continue
			}
			for _, name := range []string{s.Name, "localhost"} {
				if !slices.Contains(cert.Spec.DNSNames, name) {
					t.Errorf("gcp: Certificate %s: dnsNames %v lack %s", cert.Metadata.Name, cert.Spec.DNSNames, name)
				}
			}
			if !slices.Contains(cert.Spec.IPAddresses, "127.0.0.1") {
				t.Errorf("gcp: Certificate %s: ipAddresses %v lack 127.0.0.1", cert.Metadata.Name, cert.Spec.IPAddresses)
			}
			for _, u := range []string{"server auth", "client auth"} {
				if !slices.Contains(cert.Spec.Usages, u) {
					t.Errorf("gcp: Certificate %s: usages %v lack %s (mutual TLS)", cert.Metadata.Name, cert.Spec.Usages, u)
				}
			}
			if iss := issuers[cert.Spec.IssuerRef.Name]; iss == nil || iss.Spec.CA == nil || certs[iss.Spec.CA.SecretName] == nil || !certs[iss.Spec.CA.SecretName].Spec.IsCA {
				t.Errorf("gcp: Certificate %s: issuer %s is not the namespace's CA Issuer", cert.Metadata.Name, cert.Spec.IssuerRef.Name)
			}
			for kind, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p != nil && p.HTTPGet != nil && p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
					t.Errorf("gcp: %s: %s probe scheme %q, want HTTPS", w, kind, p.HTTPGet.Scheme)
				}
			}
		}
	}
	for _, pm := range all[*podMonitoring](r) {
		for _, e := range pm.Spec.Endpoints {
			if e.Scheme != "https" {
				t.Errorf("gcp: PodMonitoring %s scrapes with scheme %q, want https", pm.Metadata.Name, e.Scheme)
			}
		}
	}
	for k, v := range configMaps(r)["console-env"].Data {
		if strings.HasSuffix(k, "_HTTP_URL") && !strings.HasPrefix(v, "https://") {
			t.Errorf("gcp: console-env %s=%s, want https://", k, v)
		}
	}

	// The local overlay: plaintext, no certificates.
	local := renderOverlay(t, "local")
	if n := len(all[*certificate](local)); n != 0 {
		t.Errorf("local: %d Certificates, want none", n)
	}
}

// mountedSecret returns the Secret whose volume c mounts at a folder
// holding file, or "".
func mountedSecret(pod corev1.PodSpec, c *corev1.Container, file string) string {
	if file == "" {
		return ""
	}
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	return ""
}
