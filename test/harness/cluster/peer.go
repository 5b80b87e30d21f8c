package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/test/harness/guestvm"
)

// GuestPeerSpec describes a peer node: a second node agent inside the
// first guest node, beside that node's DaemonSet pod, with a volume group
// of its own on a loop file in the guest (real device-mapper) and a Node
// object of its own that no kubelet serves. It is what a 2-core machine
// offers instead of a second kubelet guest: two agents with real
// device-mapper under one control plane, so that copies across nodes (and
// moves) run for real. Pods scheduled to a peer never run.
type GuestPeerSpec struct {
	Name string
	// VGSize is the size of the peer's loop file (default 4 GiB, sparse,
	// on the guest's system disk).
	VGSize int64
	// PoolSize is the size of each thin pool the device classes name on
	// the peer's volume group (an lvcreate size; default "1g").
	PoolSize string
}

// GuestPeer is a running peer node.
type GuestPeer struct {
	Name string
	// Guest is the guest node the peer's agent runs in.
	Guest *GuestNode
	// VG is the peer's volume group in the guest; the device classes that
	// name the guest node's main volume group name this one on the peer.
	VG string
	// PodName is the node DaemonSet's pod bound to the peer (it never
	// runs); the agent's token is bound to it.
	PodName string
	// IP is where the agent listens, the guest node's InternalIP: the
	// controller in the guest and the guest node's agent reach it there.
	IP string
	// ChannelPort, CopyPort and MetricsPort are the agent's ports in the
	// guest (its metrics on the guest's loopback).
	ChannelPort, CopyPort, MetricsPort int

	// dir is the peer's directory in the guest's work directory on the
	// host; guestDir is the same directory as the guest sees it.
	dir, guestDir string
	// state is the peer's directory on the guest's system disk (its state
	// directory, socket and loop file).
	state string
	// prepare attaches and activates the volume group (making it at the
	// first start); start starts the agent in the background.
	prepare, start string
}

// Peer ports in the guest: the guest node's own agent runs in a pod
// network namespace, so only the guest's own services (kubelet,
// containerd) share these.
const (
	peerPortBase = 19800
	peerPortStep = 10
)

// GuestPeer returns the peer node of that name, or nil.
func (c *Cluster) GuestPeer(name string) *GuestPeer {
	for _, p := range c.GuestPeers {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// peerCopyPort is the port of --node-copy-address the test bed adds to the
// DaemonSet when the manifests leave copies off (the chart's example).
const peerCopyPort = 9811

// preparePeers checks that the bed can hold peers and changes the
// manifests for them before anything is applied: the controller
// Deployment pinned to the first guest node (no pod runs on a peer, and
// the controller must reach the peers' agents in the guest) and the
// DaemonSet serving copies across nodes, so that the guest node's agent
// is a copy source too. It also reads the node channel's names.
func (c *Cluster) preparePeers(ds *appsv1.DaemonSet, controller *appsv1.Deployment) error {
	if len(c.Config.GuestNodes) == 0 {
		return errors.New("Config.GuestPeers need a guest node to run in")
	}
	if len(c.Config.Nodes) > 0 && !c.Config.ControllerOnGuest {
		return errors.New("Config.GuestPeers beside simulated nodes need Config.ControllerOnGuest: a controller run as host processes cannot reach the peers in the guest")
	}
	seen := map[string]bool{}
	for _, g := range c.Config.GuestNodes {
		seen[g.Name] = true
	}
	for _, n := range c.Config.Nodes {
		seen[n.Name] = true
	}
	for _, p := range c.Config.GuestPeers {
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 || seen[p.Name] {
			return fmt.Errorf("Config.GuestPeers: name %q is not a DNS label or is taken by another node", p.Name)
		}
		seen[p.Name] = true
	}
	if len(c.Config.GuestPeers)*peerPortStep > 100 {
		return errors.New("Config.GuestPeers: at most 10 peers")
	}
	if err := checkNodeContainers(ds); err != nil {
		return err
	}
	if c.NodeChannel == nil {
		carveC, err := findContainer(&controller.Spec.Template.Spec, "Deployment "+controller.Name, "carve controller", isCarveController)
		if err != nil {
			return err
		}
		if c.NodeChannel, err = nodeChannelOf(carveC, controller.Namespace, ds); err != nil {
			return err
		}
	}
	if err := c.Manifests.PinDeployment(controller.Namespace, controller.Name, c.Config.GuestNodes[0].Name); err != nil {
		return err
	}
	if !servesCopies(ds) {
		return c.Manifests.AddNodeAgentArg("--node-copy-address=$(POD_IP):" + strconv.Itoa(peerCopyPort))
	}
	return nil
}

// startGuestPeers gives each peer its Node and CSINode objects, its volume
// group in the first guest node, its device-class file, token and agent,
// then does the kubelet's and the EndpointSlice controller's part once
// the controller (on the guest) has published its CA, and waits until the
// controller has enrolled every peer.
func (c *Cluster) startGuestPeers(ctx context.Context, ds *appsv1.DaemonSet) error {
	if len(c.Config.GuestPeers) == 0 {
		return nil
	}
	guest := c.GuestNodes[0]
	classes, err := c.bedDeviceClasses()
	if err != nil {
		return err
	}
	ct, err := daemonSetContainer(ds, "carve node", isCarvePlugin)
	if err != nil {
		return err
	}
	bin, err := containerProgram(c.Config.CarveBin, ct)
	if err != nil {
		return err
	}
	binDir := filepath.Join(guest.Spec.WorkDir, "peers", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	// The guest runs the host's build through its shared work directory.
	if err := copyFile(bin, filepath.Join(binDir, filepath.Base(bin))); err != nil {
		return err
	}
	guestBin := path.Join(guestvm.GuestWorkDir, "peers", "bin", filepath.Base(bin))
	var names []string
	for i, spec := range c.Config.GuestPeers {
		if err := createNodeObjects(ctx, c.Client, spec.Name); err != nil {
			return err
		}
		pods, err := waitDaemonSetPods(ctx, c.Client, ds, []string{spec.Name}, 2*time.Minute)
		if err != nil {
			return err
		}
		base := peerPortBase + i*peerPortStep
		p := &GuestPeer{
			Name: spec.Name, Guest: guest, VG: "carve-" + spec.Name, PodName: pods[spec.Name], IP: guestNodeIP(0),
			ChannelPort: base + 9, MetricsPort: base + 1, CopyPort: base + 2,
			dir:      filepath.Join(guest.Spec.WorkDir, "peers", spec.Name),
			guestDir: path.Join(guestvm.GuestWorkDir, "peers", spec.Name),
			state:    path.Join("/var/lib/node/peers", spec.Name),
		}
		c.GuestPeers = append(c.GuestPeers, p)
		if err := os.MkdirAll(p.dir, 0o755); err != nil {
			return err
		}
		file, pools := peerDeviceClasses(classes, p.VG)
		data, err := yaml.Marshal(file)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(p.dir, "device-classes.yaml"), data, 0o644); err != nil {
			return err
		}
		if err := c.NodeChannel.writeTokenFor(ctx, c.Client, p.Name, p.PodName, filepath.Join(p.dir, "token"), c.Config.Lifetime); err != nil {
			return err
		}
		p.prepare = p.vgScript(spec, pools)
		if p.start, err = p.startScript(ds, guestBin); err != nil {
			return err
		}
		if err := p.StartAgent(ctx); err != nil {
			return err
		}
		klog.InfoS("Peer node agent started in the guest", "peer", p.Name, "guest", guest.Spec.Name, "address", net.JoinHostPort(p.IP, strconv.Itoa(p.ChannelPort)))
		names = append(names, p.Name)
	}
	ca, err := c.NodeChannel.waitCABundle(ctx, c.Client, nil, 10*time.Minute)
	if err != nil {
		return err
	}
	for _, p := range c.GuestPeers {
		if err := os.WriteFile(filepath.Join(p.dir, "ca.crt"), ca, 0o644); err != nil {
			return err
		}
		if err := c.NodeChannel.publishSlice(ctx, c.Client, p.Name, p.PodName, p.Name, p.IP, p.ChannelPort); err != nil {
			return err
		}
	}
	scs, err := c.StorageClasses()
	if err != nil {
		return err
	}
	var scNames []string
	for _, sc := range scs {
		scNames = append(scNames, sc.Name)
	}
	if err := c.NodeChannel.waitCapacity(ctx, c.Client, nil, names, scNames, 5*time.Minute); err != nil {
		return fmt.Errorf("%w; the peers' agent logs:\n%s", err, c.peerLogs(20))
	}
	return nil
}

// bedDeviceClasses is the device-class file the test bed ships to its
// nodes: Config.DeviceClasses when set, else the manifests'.
func (c *Cluster) bedDeviceClasses() (*deviceclass.Config, error) {
	if c.Config.DeviceClasses == "" {
		return c.DeviceClasses, nil
	}
	cfg := &deviceclass.Config{}
	if err := yaml.UnmarshalStrict([]byte(c.Config.DeviceClasses), cfg); err != nil {
		return nil, fmt.Errorf("Config.DeviceClasses: %w", err)
	}
	return cfg, nil
}

// peerDeviceClasses is a peer's device-class file: the bed's, with every
// class on the volume group of the default class (the guest node's own,
// "carve" as shipped) pointed at vg, and the thin pools those classes
// name. Classes on other volume groups stay as they are (a class absent
// from the guest node is absent from its peer too).
func peerDeviceClasses(bed *deviceclass.Config, vg string) (*deviceclass.Config, []string) {
	main := ""
	for _, dc := range bed.DeviceClasses {
		if dc.Default {
			main = dc.VolumeGroup
		}
	}
	if main == "" && len(bed.DeviceClasses) > 0 {
		main = bed.DeviceClasses[0].VolumeGroup
	}
	out := &deviceclass.Config{}
	var pools []string
	for _, dc := range bed.DeviceClasses {
		if dc.VolumeGroup == main {
			dc.VolumeGroup = vg
			if dc.ThinPool != "" && !slices.Contains(pools, dc.ThinPool) {
				pools = append(pools, dc.ThinPool)
			}
		}
		out.DeviceClasses = append(out.DeviceClasses, dc)
	}
	return out, pools
}

// vgScript makes the peer's volume group and thin pools on a loop file of
// the guest's system disk (a guest reboot keeps it; the script only
// attaches and activates it again).
func (p *GuestPeer) vgScript(spec GuestPeerSpec, pools []string) string {
	size := spec.VGSize
	if size == 0 {
		size = 4 << 30
	}
	poolSize := spec.PoolSize
	if poolSize == "" {
		poolSize = "1g"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `set -eu
mkdir -p %[1]s/state
f=%[1]s/pv.img
[ -e "$f" ] || truncate -s %[2]d "$f"
dev=$(losetup -j "$f" | cut -d: -f1)
[ -n "$dev" ] || dev=$(losetup -f --show "$f")
if ! vgs %[3]s > /dev/null 2>&1; then
  pvcreate -q -y "$dev"
  vgcreate -q -y %[3]s "$dev"
`, p.state, size, p.VG)
	for _, pool := range pools {
		fmt.Fprintf(&b, "  lvcreate -q -y --type thin-pool -L %s -n %s %s\n", poolSize, pool, p.VG)
	}
	fmt.Fprintf(&b, "fi\nvgchange -q -ay %s\n", p.VG)
	return b.String()
}

// startScript is the script that starts the peer's agent in the
// background in the guest with the DaemonSet's program, args and env, the
// flags of a process that is not in a pod replaced (as for a simulated
// node), and its pid in agent.pid.
func (p *GuestPeer) startScript(ds *appsv1.DaemonSet, bin string) (string, error) {
	c, err := daemonSetContainer(ds, "carve node", isCarvePlugin)
	if err != nil {
		return "", err
	}
	flags := []FlagValue{
		{"endpoint", "unix://" + path.Join(p.state, "csi.sock")},
		{"state-dir", path.Join(p.state, "state")},
		{"config", path.Join(p.guestDir, "device-classes.yaml")},
		{"metrics-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.MetricsPort))},
		{"kubelet-registration-dir", ""},
		{"node-channel-address", net.JoinHostPort(p.IP, strconv.Itoa(p.ChannelPort))},
		{"node-channel-ca-file", path.Join(p.guestDir, "ca.crt")},
		{"node-channel-token-file", path.Join(p.guestDir, "token")},
		{"node-copy-address", net.JoinHostPort(p.IP, strconv.Itoa(p.CopyPort))},
		// A process in the guest sees the guest's cgroup tree where it is.
		{"cgroup-root", "/sys/fs/cgroup"},
	}
	pod := PodFields{Namespace: ds.Namespace, Node: p.Name, Pod: p.PodName, IP: p.IP}
	args, env, err := ContainerCommand(c, pod, flags)
	if err != nil {
		return "", err
	}
	env = append(env, "LVM_SUPPRESS_FD_WARNINGS=1")
	argv := append(append([]string{"setsid", "env"}, env...), bin)
	argv = append(argv, args...)
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	sock, pid, log := path.Join(p.state, "csi.sock"), path.Join(p.guestDir, "agent.pid"), path.Join(p.guestDir, "agent.log")
	return fmt.Sprintf(`set -u
rm -f %[1]s
%[2]s < /dev/null >> %[4]s 2>&1 &
echo $! > %[3]s
i=0
until [ -S %[1]s ]; do
  kill -0 $(cat %[3]s) 2> /dev/null || { echo "the agent exited:"; tail -n 20 %[4]s; exit 1; }
  i=$((i+1)); [ $i -lt 600 ] || { echo "no socket after 60 s:"; tail -n 20 %[4]s; exit 1; }
  sleep 0.1
done
`, sock, strings.Join(quoted, " "), pid, log), nil
}

// StartAgent starts the peer's agent (again, after KillAgent or a reboot
// of the guest) and waits for its socket. Its volume group is attached and
// activated first (made, at the first start).
func (p *GuestPeer) StartAgent(ctx context.Context) error {
	if _, err := p.Guest.Exec(ctx, p.prepare); err != nil {
		return fmt.Errorf("volume group of peer %s: %w", p.Name, err)
	}
	if _, err := p.Guest.Exec(ctx, p.start); err != nil {
		return fmt.Errorf("agent of peer %s: %w", p.Name, err)
	}
	return nil
}

// KillAgent ends the peer's agent as a crash would (SIGKILL).
func (p *GuestPeer) KillAgent(ctx context.Context) error {
	pid := path.Join(p.guestDir, "agent.pid")
	if _, err := p.Guest.Exec(ctx, fmt.Sprintf("kill -KILL $(cat %[1]s) && while kill -0 $(cat %[1]s) 2> /dev/null; do sleep 0.1; done", pid)); err != nil {
		return fmt.Errorf("kill the agent of peer %s: %w", p.Name, err)
	}
	return nil
}

// KillAgentWhen kills the peer's agent (SIGKILL) as soon as condition, a
// shell command run in the guest every 50 ms, succeeds: a crash at a chosen
// step (an LV tagged copy=pending, say), with no round trip to the host
// between seeing it and the kill. It fails when condition does not hold
// within timeout, and then kills nothing.
func (p *GuestPeer) KillAgentWhen(ctx context.Context, condition string, timeout time.Duration) error {
	return p.signalWhen(ctx, condition, "KILL", timeout)
}

// StopAgentWhen stops the peer's agent (SIGSTOP: a hung process, a paused
// machine) as soon as condition holds, as KillAgentWhen kills it;
// ContinueAgent lets it run again.
func (p *GuestPeer) StopAgentWhen(ctx context.Context, condition string, timeout time.Duration) error {
	return p.signalWhen(ctx, condition, "STOP", timeout)
}

// ContinueAgent lets an agent StopAgentWhen stopped run again (SIGCONT).
func (p *GuestPeer) ContinueAgent(ctx context.Context) error {
	if _, err := p.Guest.Exec(ctx, fmt.Sprintf("kill -CONT $(cat %s)", path.Join(p.guestDir, "agent.pid"))); err != nil {
		return fmt.Errorf("continue the agent of peer %s: %w", p.Name, err)
	}
	return nil
}

// signalWhen sends the agent sig once condition holds; after KILL, it
// waits for the process to be gone.
func (p *GuestPeer) signalWhen(ctx context.Context, condition, sig string, timeout time.Duration) error {
	pid := path.Join(p.guestDir, "agent.pid")
	wait := ""
	if sig == "KILL" {
		wait = fmt.Sprintf("while kill -0 $(cat %s) 2> /dev/null; do sleep 0.05; done", pid)
	}
	script := fmt.Sprintf(`end=$(( $(date +%%s) + %[1]d ))
until { %[2]s ; } > /dev/null 2>&1; do
  [ $(date +%%s) -lt $end ] || { echo "the condition did not hold within %[1]d s: %[3]s"; exit 1; }
  sleep 0.05
done
kill -%[5]s $(cat %[4]s)
%[6]s
`, int(timeout.Seconds()), condition, strings.ReplaceAll(condition, `"`, `'`), pid, sig, wait)
	if _, err := p.Guest.Exec(ctx, script); err != nil {
		return fmt.Errorf("signal %s to the agent of peer %s: %w", sig, p.Name, err)
	}
	return nil
}

// LogPath is the host path of the peer agent's log.
func (p *GuestPeer) LogPath() string { return filepath.Join(p.dir, "agent.log") }

// peerLogs is the tail of every peer agent's log.
func (c *Cluster) peerLogs(lines int) string {
	var b strings.Builder
	for _, p := range c.GuestPeers {
		fmt.Fprintf(&b, "----- last %d lines of peer %s's agent (%s)\n%s\n", lines, p.Name, p.LogPath(), tailFile(p.LogPath(), lines))
	}
	return b.String()
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// copyFile copies src to dst (made executable).
func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, in.Close()) }()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return errors.Join(err, out.Close())
	}
	return out.Close()
}
