// Package guestnode runs a real Kubernetes node in a qemu guest (package
// guestvm): a kubelet, containerd with runc and the CNI bridge, and real
// device-mapper on virtio disks, joined to a control plane on the host's
// loopback. The node's state (the kubelet's and containerd's directories, the
// data disk) lives on disk images that survive a Stop, so a second Start of
// the same node is a reboot.
//
// The host talks to the guest in three ways: the kubelet's API through a
// host port forwarded to the guest (for the apiserver's logs and exec),
// commands dropped into the shared work directory (Exec), and the logs the
// guest writes there.
package guestnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// GuestAPIServerPort is the port at guestvm.GuestForwardIP where the guest
// reaches the host's apiserver.
const GuestAPIServerPort = 6443

// KubeletPort is the kubelet's port in the guest.
const KubeletPort = 10250

// Spec describes one node.
type Spec struct {
	// Name is the Node's name.
	Name string
	// NodeIP is the node's InternalIP: an address the guest adds to its
	// interface and the kubelet reports. The host reaches it only through
	// KubeletHostAddr, so it need not route anywhere; it only has to be
	// unique among the nodes (the apiserver's egress proxy maps it).
	NodeIP string
	// WorkDir is the node's directory on the host: the guest's shared
	// work directory, its disk images and its logs. Reuse it to reboot.
	WorkDir string
	// Kubelet is the kubelet binary on the host.
	Kubelet string
	// Images are OCI archives imported into containerd's k8s.io namespace
	// at the first boot.
	Images []string
	// APIServer is the host's apiserver address (127.0.0.1:port).
	APIServer string
	// CACert is the apiserver's CA certificate file; Token a bearer token
	// the kubelet uses.
	CACert, Token string
	// KubeletHostAddr is the loopback host:port forwarded to the kubelet.
	KubeletHostAddr string
	// Forwards are more host listeners the guest reaches at
	// guestvm.GuestForwardIP (the simulated nodes' agents, for a
	// controller that runs in this guest).
	Forwards []guestvm.Forward
	// HostForwards are more guest ports reachable on the host's loopback
	// (a hostNetwork pod's server that a test's client outside the guest
	// talks to).
	HostForwards []guestvm.HostForward
	// DataDiskSize is the size of the data disk (/dev/vdb), sparse.
	DataDiskSize int64
	// FirstBoot is a shell script run once, at the first boot, before the
	// kubelet starts (e.g. making the volume groups on /dev/vdb). It must
	// be idempotent only in the sense that a failed first boot is retried
	// from a fresh node directory.
	FirstBoot string
	// MemoryMiB is the guest's memory; default 3072.
	MemoryMiB int
	// Lifetime bounds the guest's run; default 30 minutes.
	Lifetime time.Duration
	// Console receives the guest's serial console, when set.
	Console io.Writer
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func (s *Spec) validate() error {
	var errs []error
	if !nodeNameRE.MatchString(s.Name) {
		errs = append(errs, fmt.Errorf("guestnode: Name %q is not a DNS label", s.Name))
	}
	if ip := net.ParseIP(s.NodeIP); ip == nil || ip.To4() == nil || ip.IsLoopback() {
		errs = append(errs, fmt.Errorf("guestnode: NodeIP %q must be a non-loopback IPv4 address", s.NodeIP))
	}
	if !filepath.IsAbs(s.WorkDir) {
		errs = append(errs, fmt.Errorf("guestnode: WorkDir %q must be an absolute path", s.WorkDir))
	}
	for _, f := range append([]string{s.Kubelet, s.CACert}, s.Images...) {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("guestnode: %w", err))
		}
	}
	if s.Token == "" || strings.ContainsAny(s.Token, "\n\"") {
		errs = append(errs, errors.New("guestnode: Token must be set and on one line"))
	}
	if s.DataDiskSize <= 0 {
		errs = append(errs, errors.New("guestnode: DataDiskSize must be positive"))
	}
	return errors.Join(errs...)
}

// Node is a node whose guest may be running.
type Node struct {
	Spec Spec

	// servingCert and servingKey (PEM) are the kubelet's serving
	// certificate, given to it from the host: a kubelet that makes its own
	// writes it to the system disk without a sync, and a power cut soon
	// after leaves empty files the kubelet then refuses to start with.
	servingCert, servingKey []byte

	mu      sync.Mutex
	running *run
	seq     int
}

// run is one boot of the guest.
type run struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    guestvm.Result
	err    error
}

// New returns a node that is not running yet.
func New(spec Spec) (*Node, error) {
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 3072
	}
	if spec.Lifetime == 0 {
		spec.Lifetime = 30 * time.Minute
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	cert, key, err := servingCertificate(spec.Name, spec.NodeIP)
	if err != nil {
		return nil, fmt.Errorf("guestnode %s: %w", spec.Name, err)
	}
	return &Node{Spec: spec, servingCert: cert, servingKey: key}, nil
}

// Paths in the work directory.
const (
	systemDisk = "disks/system.img"
	dataDisk   = "disks/data.img"
	ctlDir     = "ctl"
	logDir     = "logs"
)

// systemDiskSize holds the kubelet's and containerd's state (images
// unpacked, pod directories).
const systemDiskSize = 8 << 30

// LogPath returns the host path of one of the guest's logs: "kubelet",
// "containerd", "boot".
func (n *Node) LogPath(name string) string {
	return filepath.Join(n.Spec.WorkDir, logDir, name+".log")
}

// Start boots the guest and returns once its kubelet has started (the Node
// object's readiness is for the caller to wait for). It fails when the guest
// is already running.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running != nil {
		return fmt.Errorf("guestnode %s: already running", n.Spec.Name)
	}
	s := n.Spec
	for _, d := range []string{"disks", ctlDir, logDir} {
		if err := os.MkdirAll(filepath.Join(s.WorkDir, d), 0o755); err != nil {
			return fmt.Errorf("guestnode %s: %w", s.Name, err)
		}
	}
	// Leftovers of the previous boot must not be taken for this one's.
	old, err := filepath.Glob(filepath.Join(s.WorkDir, ctlDir, "*"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("guestnode %s: %w", s.Name, err)
		}
	}
	for _, d := range []struct {
		name string
		size int64
	}{{systemDisk, systemDiskSize}, {dataDisk, s.DataDiskSize}} {
		if err := makeSparse(filepath.Join(s.WorkDir, d.name), d.size); err != nil {
			return fmt.Errorf("guestnode %s: %w", s.Name, err)
		}
	}
	files, err := n.files()
	if err != nil {
		return err
	}
	spec := guestvm.Spec{
		WorkDir:      s.WorkDir,
		Files:        files,
		Args:         []string{"/bin/sh", guestvm.GuestPath("node.sh")},
		Modules:      []string{"bridge", "veth", "br_netfilter"},
		Forwards:     append([]guestvm.Forward{{GuestPort: GuestAPIServerPort, HostAddr: s.APIServer}}, s.Forwards...),
		HostForwards: append([]guestvm.HostForward{{HostAddr: s.KubeletHostAddr, GuestPort: KubeletPort}}, s.HostForwards...),
		Disks:        []string{filepath.Join(s.WorkDir, systemDisk), filepath.Join(s.WorkDir, dataDisk)},
		Timeout:      s.Lifetime,
		MemoryMiB:    s.MemoryMiB,
		Console:      s.Console,
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &run{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.res, r.err = guestvm.Run(rctx, spec)
	}()
	n.running = r
	started := filepath.Join(s.WorkDir, ctlDir, "kubelet-started")
	for {
		if _, err := os.Stat(started); err == nil {
			return nil
		}
		select {
		case <-r.done:
			n.running = nil
			return fmt.Errorf("guestnode %s: the guest ended before its kubelet started (exit %d, %w); boot log:\n%s",
				s.Name, r.res.ExitCode, r.err, tailFile(n.LogPath("boot"), 30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Running tells whether the guest is up.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running != nil
}

// Stop shuts the guest down the way a node's power button would after a
// sync: the guest flushes its disks and powers off, with no orderly stop of
// the kubelet or the containers. It waits up to timeout, then pulls the
// plug.
func (n *Node) Stop(timeout time.Duration) error {
	n.mu.Lock()
	r := n.running
	n.running = nil
	n.mu.Unlock()
	if r == nil {
		return nil
	}
	stop := filepath.Join(n.Spec.WorkDir, ctlDir, "stop")
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		r.cancel()
	}
	select {
	case <-r.done:
	case <-time.After(timeout):
		r.cancel()
		<-r.done
		return fmt.Errorf("guestnode %s: the guest did not power off within %s; killed", n.Spec.Name, timeout)
	}
	r.cancel()
	if r.err != nil {
		return fmt.Errorf("guestnode %s: %w", n.Spec.Name, r.err)
	}
	return nil
}

// PowerCut ends the guest as a power cut would: qemu is killed at once,
// and whatever the guest had not yet written to its disks (its page
// cache, a write still queued) is lost; what it flushed is on the disk
// files, which a later Start boots from.
func (n *Node) PowerCut() {
	n.mu.Lock()
	r := n.running
	n.running = nil
	n.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// Exec runs script with the guest's /bin/sh (as root, in the host's
// userland) and returns its combined output. A non-zero exit is an error
// that carries the output.
func (n *Node) Exec(ctx context.Context, script string) (string, error) {
	n.mu.Lock()
	if n.running == nil {
		n.mu.Unlock()
		return "", fmt.Errorf("guestnode %s: not running", n.Spec.Name)
	}
	done := n.running.done
	n.seq++
	base := filepath.Join(n.Spec.WorkDir, ctlDir, "cmd-"+strconv.Itoa(n.seq))
	n.mu.Unlock()
	// The guest picks up *.sh files: write under another name first.
	if err := os.WriteFile(base+".tmp", []byte(script), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(base+".tmp", base+".sh"); err != nil {
		return "", err
	}
	for {
		if rc, err := os.ReadFile(base + ".rc"); err == nil {
			out, rerr := os.ReadFile(base + ".out")
			if rerr != nil {
				return "", rerr
			}
			if code := strings.TrimSpace(string(rc)); code != "0" {
				return string(out), fmt.Errorf("guestnode %s: command exited %s: %s", n.Spec.Name, code, strings.TrimSpace(string(out)))
			}
			return string(out), nil
		}
		select {
		case <-done:
			return "", fmt.Errorf("guestnode %s: the guest ended while running a command", n.Spec.Name)
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// makeSparse creates a sparse file of size bytes unless it exists.
func makeSparse(path string, size int64) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return errors.Join(f.Truncate(size), f.Close())
}

// tailFile returns the last lines of a file, or why it cannot.
func tailFile(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
