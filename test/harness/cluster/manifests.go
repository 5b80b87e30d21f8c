package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Manifests are the objects of carve's deploy/kubernetes directory.
type Manifests struct {
	Objects []*unstructured.Unstructured
}

// kindOrder applies objects that others refer to first.
var kindOrder = map[string]int{
	"CustomResourceDefinition": 0, "Namespace": 0, "ServiceAccount": 1, "ClusterRole": 2, "Role": 2,
	"ClusterRoleBinding": 3, "RoleBinding": 3, "ConfigMap": 4, "CSIDriver": 5,
	"StorageClass": 6, "DaemonSet": 7, "Deployment": 7,
}

// LoadManifests reads every *.yaml file of dir (kustomization.yaml aside)
// as multi-document YAML.
func LoadManifests(dir string) (*Manifests, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	m := &Manifests{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := ParseManifests(data, f)
		if err != nil {
			return nil, err
		}
		m.Objects = append(m.Objects, objs.Objects...)
	}
	if len(m.Objects) == 0 {
		return nil, fmt.Errorf("no manifests in %s", dir)
	}
	m.sort()
	return m, nil
}

// ParseManifests decodes multi-document YAML; source names it in errors.
func ParseManifests(data []byte, source string) (*Manifests, error) {
	m := &Manifests{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("%s: a document without kind or apiVersion", source)
		}
		m.Objects = append(m.Objects, u)
	}
	m.sort()
	return m, nil
}

func (m *Manifests) sort() {
	sort.SliceStable(m.Objects, func(i, j int) bool {
		return order(m.Objects[i].GetKind()) < order(m.Objects[j].GetKind())
	})
}

func order(kind string) int {
	if o, ok := kindOrder[kind]; ok {
		return o
	}
	return 8
}

// Apply creates every object with the dynamic client, so the apiserver
// validates the manifests as it would on a real cluster. Objects that exist
// already are left alone.
func (m *Manifests) Apply(ctx context.Context, cfg *rest.Config) error {
	return m.each(cfg, func(ri dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		return nil
	})
}

// DryRun sends every object to the apiserver as a create with dryRun=All
// and strict field validation: decoded, defaulted, validated and admitted as
// a real create would be, and stored nowhere. An object whose name exists
// already was validated before the apiserver found the name taken.
func (m *Manifests) DryRun(ctx context.Context, cfg *rest.Config) error {
	return m.each(cfg, func(ri dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		_, err := ri.Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s %s/%s (dry run): %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		return nil
	})
}

// Missing returns the objects that the apiserver does not hold.
func (m *Manifests) Missing(ctx context.Context, cfg *rest.Config) ([]string, error) {
	var missing []string
	err := m.each(cfg, func(ri dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		_, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			missing = append(missing, obj.GetKind()+" "+obj.GetNamespace()+"/"+obj.GetName())
			return nil
		}
		return err
	})
	return missing, err
}

// each calls fn with every object and the client of its resource.
func (m *Manifests) each(cfg *rest.Config, fn func(dynamic.ResourceInterface, *unstructured.Unstructured) error) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, obj := range m.Objects {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = client.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = corev1.NamespaceDefault
			}
			ri = client.Resource(mapping.Resource).Namespace(ns)
		}
		if err := fn(ri, obj); err != nil {
			return err
		}
	}
	return nil
}

// Find returns the objects of a kind.
func (m *Manifests) Find(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range m.Objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// ControllerDeployment returns the Deployment whose pod runs `carve
// controller` (beside the CSI sidecars).
func (m *Manifests) ControllerDeployment() (*appsv1.Deployment, error) {
	for _, o := range m.Find("Deployment") {
		d := &appsv1.Deployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
			return nil, fmt.Errorf("decode the Deployment %s: %w", o.GetName(), err)
		}
		if _, err := findContainer(&d.Spec.Template.Spec, "", "", isCarveController); err == nil {
			return d, nil
		}
	}
	return nil, errors.New("no Deployment in the manifests runs `carve controller`")
}

// PinDeployment adds a node selector to the Deployment namespace/name so
// that its pods run on node only.
func (m *Manifests) PinDeployment(namespace, name, node string) error {
	for _, o := range m.Find("Deployment") {
		if o.GetNamespace() != namespace || o.GetName() != name {
			continue
		}
		sel, _, err := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
		if err != nil {
			return fmt.Errorf("the node selector of Deployment %s/%s: %w", namespace, name, err)
		}
		if sel == nil {
			sel = map[string]string{}
		}
		sel["kubernetes.io/hostname"] = node
		return unstructured.SetNestedStringMap(o.Object, sel, "spec", "template", "spec", "nodeSelector")
	}
	return fmt.Errorf("no Deployment %s/%s in the manifests", namespace, name)
}

// AddNodeAgentArg appends arg ("--name=value") to the args of the node
// DaemonSet's carve node container (a flag the test bed needs and the
// shipped manifests leave off).
func (m *Manifests) AddNodeAgentArg(arg string) error {
	ds, err := m.NodeDaemonSet()
	if err != nil {
		return err
	}
	return m.addArg("DaemonSet", ds.Namespace, ds.Name, &ds.Spec.Template.Spec, isCarvePlugin, arg)
}

// AddControllerArg appends arg ("--name=value") to the args of the
// controller Deployment's carve controller container.
func (m *Manifests) AddControllerArg(arg string) error {
	d, err := m.ControllerDeployment()
	if err != nil {
		return err
	}
	return m.addArg("Deployment", d.Namespace, d.Name, &d.Spec.Template.Spec, isCarveController, arg)
}

// addArg appends arg to the args of the container is picks in the pod
// template of the object kind namespace/name (spec is that template
// decoded).
func (m *Manifests) addArg(kind, namespace, name string, spec *corev1.PodSpec, is func(*corev1.Container) bool, arg string) error {
	for _, o := range m.Find(kind) {
		if o.GetNamespace() != namespace || o.GetName() != name {
			continue
		}
		containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		if err != nil {
			return fmt.Errorf("the containers of %s %s/%s: %w", kind, namespace, name, err)
		}
		for i := range spec.Containers {
			if !is(&spec.Containers[i]) {
				continue
			}
			ct, ok := containers[i].(map[string]any)
			if !ok {
				return fmt.Errorf("%s %s/%s: container %d is not an object", kind, namespace, name, i)
			}
			args, _, err := unstructured.NestedStringSlice(ct, "args")
			if err != nil {
				return fmt.Errorf("%s %s/%s: the args of container %d: %w", kind, namespace, name, i, err)
			}
			if err := unstructured.SetNestedStringSlice(ct, append(args, arg), "args"); err != nil {
				return err
			}
			return unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers")
		}
	}
	return fmt.Errorf("no container for %s in %s %s/%s", arg, kind, namespace, name)
}

// NodeDaemonSet returns the DaemonSet whose pod runs `carve node` (the
// node agent).
func (m *Manifests) NodeDaemonSet() (*appsv1.DaemonSet, error) {
	for _, o := range m.Find("DaemonSet") {
		ds := &appsv1.DaemonSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
			return nil, fmt.Errorf("DaemonSet %s: %w", o.GetName(), err)
		}
		if _, err := daemonSetContainer(ds, "carve node", isCarvePlugin); err == nil {
			return ds, nil
		}
	}
	return nil, errors.New("no DaemonSet in the manifests runs `carve node`")
}

// SetDeviceClasses replaces the device-class file (config.yaml) of the
// ConfigMap in namespace that holds one: the one override a test bed makes,
// since its disks are not a fleet's.
func (m *Manifests) SetDeviceClasses(namespace, file string) error {
	for _, o := range m.Find("ConfigMap") {
		if o.GetNamespace() != namespace {
			continue
		}
		if _, ok, err := unstructured.NestedString(o.Object, "data", "config.yaml"); err != nil || !ok {
			continue
		}
		return unstructured.SetNestedField(o.Object, file, "data", "config.yaml")
	}
	return fmt.Errorf("no ConfigMap with a config.yaml in namespace %s", namespace)
}

// DeviceClassFile returns the shipped device-class file (the config.yaml of
// the ConfigMap the DaemonSet mounts).
func (m *Manifests) DeviceClassFile() (string, error) {
	for _, o := range m.Find("ConfigMap") {
		if data, ok, err := unstructured.NestedString(o.Object, "data", "config.yaml"); err == nil && ok {
			return data, nil
		}
	}
	return "", errors.New("no ConfigMap with a config.yaml in the manifests")
}

// CarveImage returns the image the DaemonSet's carve container runs.
func (m *Manifests) CarveImage() (string, error) {
	ds, err := m.NodeDaemonSet()
	if err != nil {
		return "", err
	}
	c, err := daemonSetContainer(ds, "carve node", isCarvePlugin)
	if err != nil {
		return "", err
	}
	return c.Image, nil
}
