package deploy_test

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/toolsvc/toolsvc/internal/app"
)

const kubeDir = "kubernetes"

// manifests are the decoded Kubernetes objects of kubeDir, by kind and name.
type manifests struct {
	deployments map[string]*appsv1.Deployment
	jobs        map[string]*batchv1.Job
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	pdbs        map[string]*policyv1.PodDisruptionBudget
	accounts    map[string]*corev1.ServiceAccount
	namespaces  map[string]*corev1.Namespace
	files       []string // the manifest files, relative to kubeDir
}

// typeMeta is what a document says it is.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// loadManifests decodes every document of every manifest in kubeDir
// strictly: an unknown field, a field of the wrong type or a duplicate key is
// an error, as is a kind this test does not know.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		deployments: map[string]*appsv1.Deployment{}, jobs: map[string]*batchv1.Job{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		accounts: map[string]*corev1.ServiceAccount{}, namespaces: map[string]*corev1.Namespace{},
	}
	paths, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		name := filepath.Base(p)
		if name == "kustomization.yaml" {
			continue
		}
		m.files = append(m.files, name)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocuments(data) {
			where := fmt.Sprintf("%s document %d", name, i+1)
			var tm typeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj interface{ GetName() string }
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				obj = decode(t, where, doc, m.deployments)
			case "batch/v1 Job":
				obj = decode(t, where, doc, m.jobs)
			case "v1 Service":
				obj = decode(t, where, doc, m.services)
			case "v1 ConfigMap":
				obj = decode(t, where, doc, m.configMaps)
			case "v1 Secret":
				obj = decode(t, where, doc, m.secrets)
			case "policy/v1 PodDisruptionBudget":
				obj = decode(t, where, doc, m.pdbs)
			case "v1 ServiceAccount":
				obj = decode(t, where, doc, m.accounts)
			case "v1 Namespace":
				obj = decode(t, where, doc, m.namespaces)
			default:
				t.Fatalf("%s: %s %s is not a kind this test validates; add it", where, tm.APIVersion, tm.Kind)
			}
			if obj.GetName() == "" {
				t.Errorf("%s: no metadata.name", where)
			}
		}
	}
	return m
}

// decode strictly decodes doc into a new T and files it under its name.
func decode[T any, PT interface {
	*T
	GetName() string
}](t *testing.T, where string, doc []byte, into map[string]PT) PT {
	t.Helper()
	obj := PT(new(T))
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if _, dup := into[obj.GetName()]; dup {
		t.Fatalf("%s: a second object named %q", where, obj.GetName())
	}
	into[obj.GetName()] = obj
	return obj
}

// splitDocuments splits a YAML stream at its "---" lines, dropping empty
// documents.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), data...), []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(d []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(d, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// TestKustomization: kustomization.yaml lists exactly the manifests there
// are, and names the image the workloads use.
func TestKustomization(t *testing.T) {
	m := loadManifests(t)
	var k struct {
		APIVersion string              `json:"apiVersion"`
		Kind       string              `json:"kind"`
		Namespace  string              `json:"namespace"`
		Labels     []map[string]any    `json:"labels"`
		Resources  []string            `json:"resources"`
		Images     []map[string]string `json:"images"`
	}
	data, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml is %s %s", k.APIVersion, k.Kind)
	}
	if got, want := slices.Sorted(slices.Values(k.Resources)), slices.Sorted(slices.Values(m.files)); !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, manifests %v", got, want)
	}
	if _, ok := m.namespaces[k.Namespace]; !ok {
		t.Errorf("kustomization namespace %q has no Namespace manifest", k.Namespace)
	}
	if len(k.Images) != 1 || k.Images[0]["name"] != "toolsvc" || k.Images[0]["newTag"] == "" {
		t.Errorf("kustomization images %v: want the toolsvc image with a tag", k.Images)
	}
}

// TestKubernetesManifests: the manifests hold together as a deployment of
// toolsvc: replicas probed through grpc.health.v1 on the operations port
// (readiness the server's status, liveness the liveness service), resource
// requests and limits on every container, hardened security contexts, the
// Secret mounted as files (never as environment variables), references that
// resolve (ConfigMap and Secret keys, volumes, selectors), a migration Job
// running `migrate up`, and a PodDisruptionBudget that keeps a replica.
func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	d := m.deployments["toolsvc"]
	if d == nil {
		t.Fatal("no Deployment toolsvc")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("Deployment replicas %v: want at least 2", d.Spec.Replicas)
	}
	sel, err := metaSelector(d.Spec.Selector.MatchLabels)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Deployment selector %v does not match its pods' labels %v", sel, d.Spec.Template.Labels)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args[:1], []string{"serve"}) {
		t.Errorf("container args %v: want serve", c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}

	// The configuration the replicas read: its ports are the container's.
	cm := m.configMaps["toolsvc"]
	if cm == nil {
		t.Fatal("no ConfigMap toolsvc")
	}
	// The container's variables, those read from a ConfigMap or Secret
	// stood in for by a URL of the same kind.
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != "":
			env[e.Name] = e.Value
		case e.ValueFrom != nil && e.Name == "TOOLSVC_DATABASE_URL":
			env[e.Name] = "postgres://toolsvc@postgres:5432/toolsvc"
		}
	}
	cfg := parseConfig(t, "ConfigMap toolsvc toolsvc.yaml", cm.Data["toolsvc.yaml"], env)
	if got := port(t, cfg.Listen); got != ports["grpc"] {
		t.Errorf("listen %s, container port grpc %d", cfg.Listen, ports["grpc"])
	}
	if got := port(t, cfg.Metrics.Listen); got != ports["ops"] {
		t.Errorf("metrics.listen %s, container port ops %d", cfg.Metrics.Listen, ports["ops"])
	}
	if host, _, _ := net.SplitHostPort(cfg.Listen); host != "0.0.0.0" && host != "" {
		t.Errorf("listen %s: other pods could not reach it", cfg.Listen)
	}
	if !cfg.Auth.Enabled || cfg.TLS.CertFile == "" || cfg.TLS.KeyFile == "" {
		t.Errorf("a replica listening beyond loopback needs auth.enabled and TLS: %+v %+v", cfg.Auth, cfg.TLS)
	}

	// Probes: gRPC health on the operations port.
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil {
			t.Errorf("%s probe: want a grpc probe, got %+v", name, p)
			continue
		}
		if p.GRPC.Port != ports["ops"] {
			t.Errorf("%s probe on port %d, want the operations port %d", name, p.GRPC.Port, ports["ops"])
		}
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		want := app.LivenessService
		if name == "readiness" {
			want = "" // the server's own status: the store reachable, not draining
		}
		if service != want {
			t.Errorf("%s probe asks for service %q, want %q", name, service, want)
		}
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Error("no preStop pause before the drain")
	}

	// Files, not variables: the Secret only as a volume; its mounts and keys
	// resolve; the paths the configuration names are in it.
	sec := m.secrets["toolsvc"]
	if sec == nil {
		t.Fatal("no Secret toolsvc")
	}
	secretKeys := slices.Collect(maps.Keys(sec.StringData))
	secretMount := checkPodFiles(t, "Deployment", pod, m, secretKeys)
	for _, path := range []string{cfg.TLS.CertFile, cfg.TLS.KeyFile} {
		dir, key := filepath.Split(path)
		if filepath.Clean(dir) != secretMount || !slices.Contains(secretKeys, key) {
			t.Errorf("%s is not a key of the Secret mounted at %s", path, secretMount)
		}
	}
	dbURL := cm.Data["database_url"]
	if !strings.Contains(dbURL, "passfile="+secretMount+"/pgpass") || !slices.Contains(secretKeys, "pgpass") {
		t.Errorf("database_url %q should read the password from the Secret's pgpass", dbURL)
	}
	if passwordInURL.MatchString(dbURL) {
		t.Errorf("database_url %q carries a password", dbURL)
	}

	// The migration Job.
	job := m.jobs["toolsvc-migrate"]
	if job == nil {
		t.Fatal("no Job toolsvc-migrate")
	}
	jpod := job.Spec.Template.Spec
	if len(jpod.Containers) != 1 || !slices.Equal(jpod.Containers[0].Args, []string{"migrate", "up"}) {
		t.Errorf("migration Job does not run `migrate up`: %+v", jpod.Containers)
	}
	if jpod.RestartPolicy != corev1.RestartPolicyOnFailure && jpod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("Job restartPolicy %q", jpod.RestartPolicy)
	}
	checkPodFiles(t, "Job", jpod, m, secretKeys)
	if jsel, _ := metaSelector(d.Spec.Selector.MatchLabels); jsel.Matches(labels.Set(job.Spec.Template.Labels)) {
		t.Error("the Deployment's selector matches the migration Job's pods")
	}

	// Services and the PDB select the server's pods.
	for name, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s selects %v, not the server's pods %v", name, s.Spec.Selector, d.Spec.Template.Labels)
		}
		for _, p := range s.Spec.Ports {
			if _, ok := ports[p.TargetPort.String()]; !ok {
				t.Errorf("Service %s port %s targets %q, not a container port name", name, p.Name, p.TargetPort.String())
			}
		}
	}
	if _, ok := m.services["toolsvc"]; !ok {
		t.Error("no Service toolsvc")
	}
	pdb := m.pdbs["toolsvc"]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget toolsvc")
	}
	psel, err := metaSelector(pdb.Spec.Selector.MatchLabels)
	if err != nil || !psel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("PDB selector %v does not match the server's pods", pdb.Spec.Selector)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PDB minAvailable %v: want at least 1 and fewer than the replicas", pdb.Spec.MinAvailable)
	}
	if got := int64(*pod.TerminationGracePeriodSeconds); got <= int64(cfg.ShutdownSeconds()) {
		t.Errorf("terminationGracePeriodSeconds %d does not leave shutdown_timeout (%s) its time", got, cfg.ShutdownTimeout)
	}
}

// checkPodFiles checks a pod's containers — resources, security context, no
// Secret in the environment, every ConfigMap key and mount resolving — and
// returns where the Secret is mounted.
func checkPodFiles(t *testing.T, what string, pod corev1.PodSpec, m *manifests, secretKeys []string) (secretMount string) {
	t.Helper()
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("%s: pod does not require a non-root user", what)
	}
	if _, ok := m.accounts[pod.ServiceAccountName]; !ok {
		t.Errorf("%s: service account %q has no manifest", what, pod.ServiceAccountName)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		switch {
		case v.Secret != nil:
			if _, ok := m.secrets[v.Secret.SecretName]; !ok {
				t.Errorf("%s: volume %s mounts Secret %q, which has no manifest", what, v.Name, v.Secret.SecretName)
			}
			for _, it := range v.Secret.Items {
				if !slices.Contains(secretKeys, it.Key) {
					t.Errorf("%s: volume %s names Secret key %q, which it lacks", what, v.Name, it.Key)
				}
			}
		case v.ConfigMap != nil:
			cm, ok := m.configMaps[v.ConfigMap.Name]
			if !ok {
				t.Errorf("%s: volume %s mounts ConfigMap %q, which has no manifest", what, v.Name, v.ConfigMap.Name)
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					t.Errorf("%s: volume %s names ConfigMap key %q, which it lacks", what, v.Name, it.Key)
				}
			}
		}
	}
	for _, c := range pod.Containers {
		r := c.Resources
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := r.Requests[res]; !ok {
				t.Errorf("%s container %s: no %s request", what, c.Name, res)
			}
			if _, ok := r.Limits[res]; !ok {
				t.Errorf("%s container %s: no %s limit", what, c.Name, res)
			}
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s container %s: want no privilege escalation, a read-only root and every capability dropped", what, c.Name)
		}
		if len(c.EnvFrom) > 0 {
			t.Errorf("%s container %s: envFrom hides what a container reads", what, c.Name)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("%s container %s: Secret in variable %s; mount it as a file", what, c.Name, e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				ref := e.ValueFrom.ConfigMapKeyRef
				if cm, ok := m.configMaps[ref.Name]; !ok || cm.Data[ref.Key] == "" {
					t.Errorf("%s container %s: %s from ConfigMap %s key %s, which does not exist", what, c.Name, e.Name, ref.Name, ref.Key)
				}
			}
		}
		for _, vm := range c.VolumeMounts {
			v, ok := volumes[vm.Name]
			if !ok {
				t.Errorf("%s container %s: mount of unknown volume %s", what, c.Name, vm.Name)
				continue
			}
			if !vm.ReadOnly {
				t.Errorf("%s container %s: mount %s is writable", what, c.Name, vm.Name)
			}
			if v.Secret != nil {
				secretMount = vm.MountPath
			}
		}
	}
	if secretMount == "" {
		t.Errorf("%s: the Secret is not mounted", what)
	}
	return secretMount
}

func metaSelector(ml map[string]string) (labels.Selector, error) {
	if len(ml) == 0 {
		return nil, fmt.Errorf("empty selector")
	}
	return labels.SelectorFromSet(ml), nil
}

func port(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("address %q: %v", hostport, err)
	}
	var n int32
	if _, err := fmt.Sscan(p, &n); err != nil {
		t.Fatalf("port of %q: %v", hostport, err)
	}
	return n
}
