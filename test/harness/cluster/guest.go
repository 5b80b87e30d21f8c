package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/test/harness/guestnode"
	"github.com/carve-csi/carve/test/harness/guestvm"
)

// GuestNodeSpec describes a real node: a kubelet, containerd and real
// device-mapper in a qemu guest, running the shipped DaemonSet from the
// images in Config.Images.
type GuestNodeSpec struct {
	Name string
	// DataDiskSize is the size of the guest's data disk (/dev/vdb).
	DataDiskSize int64
	// FirstBoot runs in the guest at its first boot, before the kubelet:
	// it makes the volume groups the device classes name.
	FirstBoot string
	// HostPorts are guest ports (of hostNetwork pods) made reachable on
	// the host's loopback: GuestNode.HostPorts maps each to its address.
	HostPorts []int
}

// GuestNode is a real node of the test bed.
type GuestNode struct {
	*guestnode.Node
	// KubeletAddr is the host's loopback address of the node's kubelet
	// API (its /metrics, /stats/summary, /pods).
	KubeletAddr string
	// HostPorts maps each of GuestNodeSpec.HostPorts to the host's
	// loopback host:port forwarded to it.
	HostPorts map[int]string
}

// guestNodeIP is the InternalIP of the i-th guest node (from 0). The
// addresses exist only inside each guest; the apiserver reaches them through
// the kubelet proxy.
func guestNodeIP(i int) string { return "10.213.0." + strconv.Itoa(i+1) }

// startGuestNodes boots the guest nodes and waits until each Node is Ready.
func (c *Cluster) startGuestNodes(ctx context.Context) error {
	for i, spec := range c.Config.GuestNodes {
		port, err := FreePort()
		if err != nil {
			return err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ip := guestNodeIP(i)
		c.kubeletProxy.route(net.JoinHostPort(ip, strconv.Itoa(guestnode.KubeletPort)), addr)
		dir := filepath.Join(c.Config.RunDir, "guests", spec.Name)
		var forwards []guestvm.Forward
		if i == 0 && c.Config.ControllerOnGuest {
			// The controller there reaches each simulated node's agent at
			// guestvm.GuestForwardIP (the guest's network reaches nothing
			// else on the host).
			for _, n := range c.Nodes {
				forwards = append(forwards, guestvm.Forward{GuestPort: n.ChannelPort, HostAddr: n.ChannelAddr})
			}
		}
		hostPorts := map[int]string{}
		var hostForwards []guestvm.HostForward
		for _, gp := range spec.HostPorts {
			p, err := FreePort()
			if err != nil {
				return err
			}
			hostPorts[gp] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
			hostForwards = append(hostForwards, guestvm.HostForward{HostAddr: hostPorts[gp], GuestPort: gp})
		}
		n, err := guestnode.New(guestnode.Spec{
			Forwards:        forwards,
			HostForwards:    hostForwards,
			Name:            spec.Name,
			NodeIP:          ip,
			WorkDir:         dir,
			Kubelet:         filepath.Join(c.Config.BinDir, "kubelet"),
			Images:          c.Config.Images,
			APIServer:       c.Control.Server[len("https://"):],
			CACert:          c.Control.pki.CACert,
			Token:           c.Control.pki.AdminToken,
			KubeletHostAddr: addr,
			DataDiskSize:    spec.DataDiskSize,
			FirstBoot:       spec.FirstBoot,
			Lifetime:        c.Config.Lifetime,
		})
		if err != nil {
			return err
		}
		g := &GuestNode{Node: n, KubeletAddr: addr, HostPorts: hostPorts}
		c.GuestNodes = append(c.GuestNodes, g)
		start := time.Now()
		if err := g.bootNew(ctx, c.Client); err != nil {
			return err
		}
		klog.InfoS("Guest node Ready", "node", spec.Name, "after", time.Since(start).Round(time.Millisecond))
		if len(c.Config.Nodes) > 0 || len(c.Config.GuestPeers) > 0 {
			// Beside simulated nodes and peers the node lifecycle
			// controller is off, and only it lifts the not-ready taint a
			// new Node gets.
			if err := untaintNotReady(ctx, c.Client, spec.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// untaintNotReady removes the node.kubernetes.io/not-ready taint, as the
// node lifecycle controller does once a node is Ready.
func untaintNotReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var keep []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			keep = append(keep, t)
		}
	}
	n.Spec.Taints = keep
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("untaint Node %s: %w", name, err)
	}
	return nil
}

// bootTimeout is how long a guest may take from its start to a Ready
// Node: seen up to 3 min 52 s under TCG with the machine's two cores busy
// (containerd imports every image archive before the kubelet starts).
const bootTimeout = 6 * time.Minute

// Boot starts the guest and waits until its Node is Ready: at the first
// start and after a Stop (a reboot).
func (g *GuestNode) Boot(ctx context.Context, cs kubernetes.Interface) error {
	since := time.Now()
	if err := g.Start(ctx); err != nil {
		return err
	}
	return WaitNodeReady(ctx, cs, g.Spec.Name, since, bootTimeout)
}

// bootNew boots a new guest node, and once more when its Node never gets
// Ready: under TCG a guest's kubelet has been seen to register, then
// time out on every request through qemu's forward to the apiserver until
// its log stopped, before any carve pod ran. The bed is then the
// harness's failure, not carve's; the first boot's logs are kept as
// <name>-failed-boot.log beside the second's.
func (g *GuestNode) bootNew(ctx context.Context, cs kubernetes.Interface) error {
	err := g.Boot(ctx, cs)
	if err == nil || ctx.Err() != nil {
		return err
	}
	klog.ErrorS(err, "Guest node not Ready after its first boot; booting it again", "node", g.Spec.Name)
	g.PowerCut()
	for _, name := range []string{"kubelet", "containerd", "boot"} {
		if rerr := os.Rename(g.LogPath(name), g.LogPath(name+"-failed-boot")); rerr != nil && !os.IsNotExist(rerr) {
			klog.ErrorS(rerr, "Keeping the failed boot's log", "node", g.Spec.Name)
		}
	}
	if again := g.Boot(ctx, cs); again != nil {
		return fmt.Errorf("%w; booted again: %w", err, again)
	}
	return nil
}

// WaitNodeReady waits until the Node's Ready condition is True with a
// heartbeat after since.
func WaitNodeReady(ctx context.Context, cs kubernetes.Interface, name string, since time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no Node object"
	for time.Now().Before(deadline) {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			for _, cond := range n.Status.Conditions {
				if cond.Type != corev1.NodeReady {
					continue
				}
				last = fmt.Sprintf("Ready=%s (%s: %s)", cond.Status, cond.Reason, cond.Message)
				// Second resolution: a heartbeat in the same second as
				// since counts.
				if cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("node %s not Ready within %s (last: %s)", name, timeout, last)
}

// GuestNode returns the guest node of that name, or nil.
func (c *Cluster) GuestNode(name string) *GuestNode {
	for _, g := range c.GuestNodes {
		if g.Spec.Name == name {
			return g
		}
	}
	return nil
}

// stopGuestNodes powers the guests off and prints where their logs are.
func (c *Cluster) stopGuestNodes() error {
	var errs []error
	for _, g := range c.GuestNodes {
		if err := g.Stop(time.Minute); err != nil {
			errs = append(errs, err)
		}
		// The disk images are the bulk of a guest's directory; the logs
		// stay.
		if err := os.RemoveAll(filepath.Join(g.Spec.WorkDir, "disks")); err != nil {
			errs = append(errs, err)
		}
	}
	if c.kubeletProxy != nil {
		if err := c.kubeletProxy.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitPodsBound waits until at least want pods with these labels exist
// and all are bound to a node.
func waitPodsBound(ctx context.Context, cs kubernetes.Interface, ns string, match map[string]string, want int, timeout time.Duration) error {
	sel := labels.SelectorFromSet(match).String()
	deadline := time.Now().Add(timeout)
	for {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		bound := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if len(pods.Items) >= max(want, 1) && bound == len(pods.Items) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pods %s in %s: %d of %d bound to a node after %s", sel, ns, bound, len(pods.Items), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ShippedClassesFirstBoot is a guest's first-boot script that makes what
// the shipped device classes name, on the data disk: the volume group
// "carve" and its thin pool "pool0" of poolSize (an lvcreate size, e.g.
// "3g").
func ShippedClassesFirstBoot(poolSize string) string {
	return "pvcreate -q /dev/vdb\nvgcreate -q carve /dev/vdb\nlvcreate -q --type thin-pool -L " + poolSize + " -n pool0 carve\n"
}
