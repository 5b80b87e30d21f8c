package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// SnapshotController is deploy/kubernetes/snapshot-controller on the test
// bed: its CRDs and RBAC applied, and snapshot-controller run as a process
// with its Deployment's flags, authenticated as its service account.
type SnapshotController struct {
	Manifests *Manifests
	// Deployment is the snapshot-controller Deployment of the manifests.
	Deployment *appsv1.Deployment
	// MetricsURL is snapshot-controller's /metrics.
	MetricsURL string

	proc *Process
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// startSnapshotController applies the manifests of dir, waits until their
// CRDs are established (so that objects of their kinds can be applied
// next) and starts snapshot-controller.
func startSnapshotController(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, dir, bin, runDir, logs string, lifetime time.Duration) (*SnapshotController, error) {
	m, err := LoadManifests(dir)
	if err != nil {
		return nil, err
	}
	s := &SnapshotController{Manifests: m}
	for _, o := range m.Find("Deployment") {
		d := &appsv1.Deployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
			return nil, fmt.Errorf("decode the Deployment %s: %w", o.GetName(), err)
		}
		s.Deployment = d
	}
	if s.Deployment == nil {
		return nil, fmt.Errorf("no Deployment in %s", dir)
	}
	spec := &s.Deployment.Spec.Template.Spec
	c, err := findContainer(spec, "Deployment "+s.Deployment.Namespace+"/"+s.Deployment.Name, "snapshot-controller", func(c *corev1.Container) bool { return c.Name == "snapshot-controller" })
	if err != nil {
		return nil, err
	}
	// The process below stands in for the Deployment's pod: on a test bed
	// with a real node, the kubelet would otherwise try (and fail) to pull
	// an image no archive provides.
	for _, o := range m.Find("Deployment") {
		if err := unstructured.SetNestedField(o.Object, int64(0), "spec", "replicas"); err != nil {
			return nil, err
		}
	}
	if err := m.Apply(ctx, cp.Config); err != nil {
		return nil, fmt.Errorf("apply %s: %w", dir, err)
	}
	var crds []string
	for _, o := range m.Find("CustomResourceDefinition") {
		crds = append(crds, o.GetName())
	}
	if err := waitCRDsEstablished(ctx, cp.Config, crds, time.Minute); err != nil {
		return nil, err
	}

	work := filepath.Join(runDir, "snapshot-controller")
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	if err := serviceAccountKubeconfig(ctx, cs, cp, s.Deployment.Namespace, spec.ServiceAccountName, kubeconfig, lifetime); err != nil {
		return nil, fmt.Errorf("the snapshot-controller's service account: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	args, env, err := ContainerCommand(c, PodFields{Namespace: s.Deployment.Namespace}, []FlagValue{
		{"kubeconfig", kubeconfig},
		{"http-endpoint", fmt.Sprintf("127.0.0.1:%d", port)},
	})
	if err != nil {
		return nil, err
	}
	klog.InfoS("Starting snapshot-controller with the Deployment's flags", "args", args)
	s.proc, err = startProcess(ctx, logs, "snapshot-controller", bin, args, env, lifetime)
	return s, err
}

// waitCRDsEstablished waits until every named CRD has the condition
// Established.
func waitCRDsEstablished(ctx context.Context, cfg *rest.Config, names []string, timeout time.Duration) error {
	if len(names) == 0 {
		return errors.New("no CustomResourceDefinition to wait for")
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, name := range names {
		for {
			u, err := client.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				if established(u) {
					break
				}
				err = errors.New("condition Established is not True")
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established after %s (last error: %w)", name, timeout, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// Process is the snapshot-controller process.
func (s *SnapshotController) Process() *Process { return s.proc }

func (s *SnapshotController) processes() []*Process {
	if s == nil {
		return nil
	}
	return started(s.proc)
}

// isSnapshotter tells the csi-snapshotter container (by its image).
func isSnapshotter(c *corev1.Container) bool {
	return strings.Contains(c.Image, "/csi-snapshotter:")
}
