package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The node channel's names, as carve controller's flags default them; the
// harness reads the shipped flags and falls back to these.
const (
	defaultNodeChannelCA = "carve-node-channel-ca"
	defaultAudience      = "carve-controller"
	// NodeChannelPortName is the port of the node agents' Service.
	NodeChannelPortName = "node-channel"
	// EndpointSliceManager marks the EndpointSlices the harness writes
	// (the EndpointSlice controller leaves them alone).
	EndpointSliceManager = "carve-e2e"
)

// NodeChannel is what the harness knows of the node channel of the
// controller Deployment: where the controller looks for node agents and
// what it accepts from them.
type NodeChannel struct {
	// Namespace holds the Service, its EndpointSlices and the CA.
	Namespace string
	// Service is the headless Service over the node agents
	// (--node-channel-service).
	Service string
	// CAName names the Secret and ConfigMap of the CA (--node-channel-ca).
	CAName string
	// Audience is that of the node agents' tokens (--node-token-audience).
	Audience string
	// ServiceAccount is the node DaemonSet's.
	ServiceAccount string
	// IP is the address the simulated nodes' agents listen on: an
	// EndpointSlice may not hold a loopback address, so it is the host's.
	IP string
}

// nodeChannelOf reads the node channel's names from the controller
// Deployment's carve container and the node DaemonSet.
func nodeChannelOf(carve *corev1.Container, ns string, ds *appsv1.DaemonSet) (*NodeChannel, error) {
	nc := &NodeChannel{Namespace: ns, CAName: defaultNodeChannelCA, Audience: defaultAudience,
		ServiceAccount: ds.Spec.Template.Spec.ServiceAccountName}
	var ok bool
	if nc.Service, ok = flagValue(carve.Args, "node-channel-service"); !ok || nc.Service == "" {
		return nil, errors.New("the controller Deployment's carve controller has no --node-channel-service: the node channel is off")
	}
	if v, ok := flagValue(carve.Args, "node-channel-ca"); ok {
		nc.CAName = v
	}
	if v, ok := flagValue(carve.Args, "node-token-audience"); ok {
		nc.Audience = v
	}
	if nc.ServiceAccount == "" {
		return nil, fmt.Errorf("the node DaemonSet %s/%s names no service account", ds.Namespace, ds.Name)
	}
	ip, err := HostIP()
	if err != nil {
		return nil, err
	}
	nc.IP = ip
	return nc, nil
}

// flagValue is the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		n, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") || n != name {
			continue
		}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			return args[i+1], true
		}
		return v, true
	}
	return "", false
}

// HostIP is an IPv4 address of an interface of this host that is up and
// not loopback: where the simulated nodes' agents listen.
func HostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing network interfaces: %w", err)
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("the test bed needs an IPv4 address on a non-loopback interface: the node channel's EndpointSlices may not point at 127.0.0.1")
}

// writeToken does the kubelet's projected-token part for n's agent: a
// token of the DaemonSet's service account for the controller's audience,
// bound to n's DaemonSet pod.
func (nc *NodeChannel) writeToken(ctx context.Context, cs kubernetes.Interface, n *Node, lifetime time.Duration) error {
	return nc.writeTokenFor(ctx, cs, n.Name, n.PodName, n.ChannelTokenFile, lifetime)
}

// writeTokenFor writes to file a token for the agent of node, bound to
// its DaemonSet pod (a simulated node's or a guest peer's).
func (nc *NodeChannel) writeTokenFor(ctx context.Context, cs kubernetes.Interface, node, podName, file string, lifetime time.Duration) error {
	pod, err := cs.CoreV1().Pods(nc.Namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the DaemonSet pod of node %s: %w", node, err)
	}
	expiry := int64(max(time.Hour, lifetime+time.Hour).Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(nc.Namespace).CreateToken(ctx, nc.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{nc.Audience}, ExpirationSeconds: &expiry,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of node %s's agent: %w", node, err)
	}
	return os.WriteFile(file, []byte(tr.Status.Token), 0o600)
}

// waitCABundle waits for the controller to publish its CA's certificate
// in the ConfigMap the DaemonSet mounts, and returns it.
func (nc *NodeChannel) waitCABundle(ctx context.Context, cs kubernetes.Interface, central *Central, timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		cm, err := cs.CoreV1().ConfigMaps(nc.Namespace).Get(ctx, nc.CAName, metav1.GetOptions{})
		switch {
		case err == nil && cm.Data["ca.crt"] != "":
			return []byte(cm.Data["ca.crt"]), nil
		case err != nil && !apierrors.IsNotFound(err):
			return nil, err
		}
		if ended, err := central.exited(); ended {
			return nil, fmt.Errorf("carve controller exited (%w) before it published ConfigMap %s:\n%s", err, nc.CAName, central.tail(20))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no ca.crt in ConfigMap %s/%s after %s (carve controller makes it):\n%s", nc.Namespace, nc.CAName, timeout, central.tail(20))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// EndpointSliceName is the name of the EndpointSlice the harness publishes
// for node.
func (nc *NodeChannel) EndpointSliceName(node string) string { return nc.Service + "-" + node }

// PublishEndpoint does the EndpointSlice controller's part for n's agent
// pod once it is ready (simulated pods never run): an EndpointSlice of
// the Service with the host's address, n's port and n's pod, naming node
// as the endpoint's node. node is n.Name unless a test poses as another
// node, which an honest EndpointSlice never does.
func (nc *NodeChannel) PublishEndpoint(ctx context.Context, cs kubernetes.Interface, n *Node, node string) error {
	return nc.publishEndpointAt(ctx, cs, n, node, nc.IP)
}

// publishEndpointAt is PublishEndpoint with the address the controller
// dials n's agent at (a guest's forward of the host's listener).
func (nc *NodeChannel) publishEndpointAt(ctx context.Context, cs kubernetes.Interface, n *Node, node, addr string) error {
	return nc.publishSlice(ctx, cs, n.Name, n.PodName, node, addr, n.ChannelPort)
}

// publishSlice writes the EndpointSlice of the agent of name (whose
// DaemonSet pod is podName) at addr:port, naming node as its node.
func (nc *NodeChannel) publishSlice(ctx context.Context, cs kubernetes.Interface, name, podName, node, addr string, port int) error {
	pod, err := cs.CoreV1().Pods(nc.Namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the DaemonSet pod of node %s: %w", name, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nc.EndpointSliceName(node), Namespace: nc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: nc.Service, discoveryv1.LabelManagedBy: EndpointSliceManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(NodeChannelPortName), Port: ptr.To(int32(port))}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(nc.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("EndpointSlice of node %s: %w", node, err)
	}
	return nil
}

// waitCapacity waits until the controller has written a CSIStorageCapacity
// object for every node and StorageClass in scs: it has then enrolled
// every node and read its capacity stream, and the scheduler can place
// volumes.
func (nc *NodeChannel) waitCapacity(ctx context.Context, cs kubernetes.Interface, central *Central, nodes, scs []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		list, err := cs.StorageV1().CSIStorageCapacities(nc.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, c := range list.Items {
			if c.NodeTopology != nil {
				have[c.NodeTopology.MatchLabels[TopologyKey]+"/"+c.StorageClassName] = true
			}
		}
		var missing []string
		for _, n := range nodes {
			for _, sc := range scs {
				if !have[n+"/"+sc] {
					missing = append(missing, n+"/"+sc)
				}
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if ended, err := central.exited(); ended {
			return fmt.Errorf("carve controller exited (%w):\n%s", err, central.tail(20))
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			return fmt.Errorf("carve controller wrote no CSIStorageCapacity for %s after %s (it enrolls each node over the node channel first):\n%s",
				strings.Join(missing, ", "), timeout, central.tail(30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// mirrorCABundle does the kubelet's part of the ConfigMap the node
// DaemonSet mounts, for the simulated nodes: whenever the controller
// changes ca.crt (a CA rotation), it writes it into every node's file,
// replacing the file as the kubelet's atomic writer does, until ctx ends.
func (nc *NodeChannel) mirrorCABundle(ctx context.Context, cs kubernetes.Interface, files []string, last []byte) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cm, err := cs.CoreV1().ConfigMaps(nc.Namespace).Get(ctx, nc.CAName, metav1.GetOptions{})
		if err != nil || cm.Data["ca.crt"] == "" || cm.Data["ca.crt"] == string(last) {
			continue
		}
		last = []byte(cm.Data["ca.crt"])
		for _, f := range files {
			if err := replaceFile(f, last); err != nil {
				fmt.Fprintf(os.Stderr, "harness: writing the CA bundle %s: %v\n", f, err)
			}
		}
	}
}

// replaceFile puts data at path by renaming a new file over it.
func replaceFile(path string, data []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
