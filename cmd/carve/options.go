package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/node/registration"
)

// DefaultDriverName is carve's CSI driver name.
const DefaultDriverName = "lvm.carve.dev"

// Where the kubelet finds carve by default.
const (
	DefaultKubeletRegistrationDir = "/registration"
	DefaultKubeletCSISocket       = "/var/lib/kubelet/plugins/" + DefaultDriverName + "/csi.sock"
)

// maxSocketPath is Linux's sun_path (108 bytes) less the NUL.
const maxSocketPath = 107

// CommonOptions are the flags every serving role has.
type CommonOptions struct {
	// Endpoint is the CSI socket, unix:///path/csi.sock.
	Endpoint string
	// DriverName is the CSI driver name (GetPluginInfo, metric label).
	DriverName string
	// MetricsAddress is host:port of /metrics, /healthz and /readyz; empty
	// serves none.
	MetricsAddress string
}

// AddFlags registers the common flags on fs.
func (o *CommonOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint: a unix socket, unix:///path/csi.sock")
	fs.StringVar(&o.DriverName, "driver-name", DefaultDriverName, "CSI driver name")
	fs.StringVar(&o.MetricsAddress, "metrics-address", "", "host:port to serve Prometheus /metrics, /healthz (liveness) and /readyz (readiness) on; empty disables it")
}

// driverNameRE is the CSI rule for driver names.
var driverNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// Validate checks the common flags.
func (o *CommonOptions) Validate() error {
	var errs []error
	if _, err := csiserver.ParseEndpoint(o.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("--endpoint: %w", err))
	}
	if !driverNameRE.MatchString(o.DriverName) {
		errs = append(errs, fmt.Errorf("--driver-name %q: must be at most 63 characters of letters, digits, '-', '.', '_', starting and ending with a letter or digit", o.DriverName))
	}
	if o.MetricsAddress != "" {
		if _, port, err := net.SplitHostPort(o.MetricsAddress); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--metrics-address %q: must be host:port (host may be empty)", o.MetricsAddress))
		}
	}
	return errors.Join(errs...)
}

// NodeOptions configure the `carve node` role.
type NodeOptions struct {
	CommonOptions
	// NodeName is this node's Kubernetes name, the node ID and topology value;
	// defaults to NODE_NAME.
	NodeName string
	// ConfigPath is the device-class file.
	ConfigPath string
	// MaxVolumes is reported as max_volumes_per_node; 0 means no limit.
	MaxVolumes int64
	// RefreshInterval is how often the volume groups are re-read to catch
	// changes made outside carve.
	RefreshInterval time.Duration
	// WatchLVMBackups refreshes the view when LVM rewrites a configured VG's
	// metadata backup, without waiting for RefreshInterval.
	WatchLVMBackups bool
	// LVMTimeout bounds every lvm read and is when a mutation is asked to stop
	// (SIGINT); mutations are never killed.
	LVMTimeout time.Duration
	// KubeletRegistrationDir is the kubelet's plugins_registry as mounted; empty
	// registers nothing.
	KubeletRegistrationDir string
	// KubeletCSISocket is the CSI socket's path as the kubelet sees it.
	KubeletCSISocket string
	// StateDir holds what must survive restarts and reboots; empty is the
	// --endpoint socket's directory.
	StateDir string
	// AllowVolatileStateDir allows StateDir on tmpfs or ramfs, whose marks a
	// reboot loses.
	AllowVolatileStateDir bool
	// CgroupRoot is the host's cgroup v2 hierarchy for pods' io.max; empty
	// applies no IO limits.
	CgroupRoot string
	// NodeChannel configures the port the controller reaches this agent on.
	NodeChannel NodeChannelOptions
}

// Defaults of the node channel's files, where the DaemonSet mounts them.
const (
	DefaultNodeChannelCAFile    = "/etc/carve/node-channel/ca.crt"
	DefaultNodeChannelTokenFile = "/var/run/secrets/carve.dev/token" //nolint:gosec // G101: a path, not a credential.
)

// NodeChannelOptions configure the node channel (docs/architecture.md): the
// TLS port where only the controller calls this node's services.
type NodeChannelOptions struct {
	// Address is host:port of the TLS listener; empty turns the channel off.
	Address string
	// CAFile is the PEM bundle the controller's certificate must chain to; it is
	// re-read on change and may not exist at start.
	CAFile string
	// TokenFile is the projected token the agent proves its node with.
	TokenFile string
	// CopyAddress is host:port where other agents read this node's data for
	// granted restores and clones; empty serves no copies.
	CopyAddress string
	// ControllerOnSocket also serves the Controller service on --endpoint while
	// the node channel is on; without the channel it is always served there.
	ControllerOnSocket bool
}

func (o *NodeChannelOptions) controllerOnSocket() bool {
	return o.Address == "" || o.ControllerOnSocket
}

// AddFlags registers the node channel flags on fs.
func (o *NodeChannelOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Address, "node-channel-address", "", "host:port of the node channel, the TLS port on which carve's controller calls this node's Controller service and node agent; empty turns it off")
	fs.StringVar(&o.CAFile, "node-channel-ca-file", DefaultNodeChannelCAFile, "PEM bundle of the CAs whose controller certificate the node channel accepts (the mounted ConfigMap's ca.crt); re-read when it changes, and until it holds a valid bundle no handshake succeeds")
	fs.StringVar(&o.CopyAddress, "node-copy-address", "", "host:port on which other node agents read this node's snapshots and volumes for the restores and clones on their nodes that carve controller grants them (TLS 1.3, node certificates of the node channel's CA only); empty: this node's sources are copied to no other node. Used only with --node-channel-address")
	fs.BoolVar(&o.ControllerOnSocket, "controller-on-socket", false, "with --node-channel-address, also serve the CSI Controller service on the --endpoint socket (csi-sanity, debugging on a node); without the node channel it is always served there")
	fs.StringVar(&o.TokenFile, "node-channel-token-file", DefaultNodeChannelTokenFile, "projected service-account token (audience carve's controller) the node agent proves its node with when the controller enrolls it; re-read at every enrollment")
}

// Validate checks the node channel flags; files matter only when it is on.
func (o *NodeChannelOptions) Validate() error {
	if o.Address == "" {
		return nil
	}
	var errs []error
	if _, port, err := net.SplitHostPort(o.Address); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("--node-channel-address %q: must be host:port (host may be empty for every interface)", o.Address))
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		errs = append(errs, fmt.Errorf("--node-channel-address %q: the port must be a number from 1 to 65535 (the controller dials it)", o.Address))
	}
	if o.CopyAddress != "" {
		if _, err := copyPort(o.CopyAddress); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range []struct{ flag, path string }{
		{"--node-channel-ca-file", o.CAFile}, {"--node-channel-token-file", o.TokenFile},
	} {
		if !filepath.IsAbs(f.path) {
			errs = append(errs, fmt.Errorf("%s %q: must be an absolute path when --node-channel-address is set", f.flag, f.path))
		}
	}
	return errors.Join(errs...)
}

// copyPort is the port of --node-copy-address, sent with each grant.
func copyPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || n == 0 {
		return 0, fmt.Errorf("--node-copy-address %q: must be host:port with a port from 1 to 65535 (host may be empty for every interface)", addr)
	}
	return int(n), nil
}

// AddFlags registers the node agent's flags on fs.
func (o *NodeOptions) AddFlags(fs *flag.FlagSet) {
	o.CommonOptions.AddFlags(fs)
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Kubernetes node name (node ID and topology value); defaults to $NODE_NAME")
	fs.StringVar(&o.ConfigPath, "config", "/etc/carve/config.yaml", "device-class file (YAML)")
	fs.Int64Var(&o.MaxVolumes, "max-volumes", 0, "max_volumes_per_node reported to Kubernetes; 0 means no limit")
	fs.DurationVar(&o.RefreshInterval, "capacity-refresh-interval", time.Minute, "how often the volume-group view behind GetCapacity is re-read to catch changes made outside carve")
	fs.BoolVar(&o.WatchLVMBackups, "watch-lvm-backups", true, "refresh the volume-group view as soon as LVM rewrites a configured volume group's metadata backup ($LVM_SYSTEM_DIR/backup/<vg>, by default /etc/lvm/backup), so changes made outside carve show at once")
	fs.DurationVar(&o.LVMTimeout, "lvm-timeout", 2*time.Minute, "deadline of every lvm read, and how long an lvm mutation runs before it gets SIGINT (mutations are never killed)")
	fs.StringVar(&o.KubeletRegistrationDir, "kubelet-registration-dir", DefaultKubeletRegistrationDir,
		"the kubelet's plugin-registration directory (the host's /var/lib/kubelet/plugins_registry, mounted); carve serves <driver-name>-reg.sock there so that the kubelet registers it; empty disables registration (no kubelet)")
	fs.StringVar(&o.KubeletCSISocket, "kubelet-csi-socket", DefaultKubeletCSISocket,
		"path of the --endpoint socket as the kubelet sees it on the host; carve hands it to the kubelet at registration")
	fs.StringVar(&o.StateDir, "state-dir", "",
		"carve's own directory on the node's disk (surviving restarts and reboots; the DaemonSet's is /var/lib/carve) where it marks the volumes it is making and formatting; empty is the directory of the --endpoint socket")
	fs.BoolVar(&o.AllowVolatileStateDir, "allow-volatile-state-dir", false,
		"start even when --state-dir is on tmpfs or ramfs, which a reboot empties (a half-erased volume could then be handed out); without it the plugin refuses to start there")
	fs.StringVar(&o.CgroupRoot, "cgroup-root", "/sys/fs/cgroup",
		"the host's cgroup v2 hierarchy as carve sees it (the DaemonSet mounts it at /host/sys/fs/cgroup), where volumes' IO limits are written into the io.max of the pods they are published to; empty applies none and refuses to publish a volume with limits")
	o.NodeChannel.AddFlags(fs)
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// Validate checks the plugin flags.
func (o *NodeOptions) Validate() error {
	errs := []error{o.CommonOptions.Validate()}
	switch {
	case o.NodeName == "":
		errs = append(errs, errors.New("--node-name: must be set (or the NODE_NAME environment variable)"))
	case len(o.NodeName) > 253 || !nodeNameRE.MatchString(o.NodeName):
		errs = append(errs, fmt.Errorf("--node-name %q: not a Kubernetes node name (a DNS-1123 subdomain)", o.NodeName))
	}
	if o.ConfigPath == "" {
		errs = append(errs, errors.New("--config: must be set"))
	}
	if o.MaxVolumes < 0 {
		errs = append(errs, fmt.Errorf("--max-volumes %d: must not be negative", o.MaxVolumes))
	}
	if o.RefreshInterval < time.Second {
		errs = append(errs, fmt.Errorf("--capacity-refresh-interval %v: must be at least 1s", o.RefreshInterval))
	}
	if o.LVMTimeout < time.Second {
		errs = append(errs, fmt.Errorf("--lvm-timeout %v: must be at least 1s", o.LVMTimeout))
	}
	if o.KubeletRegistrationDir != "" {
		errs = append(errs, o.validateRegistration()...)
	}
	if o.StateDir != "" && !filepath.IsAbs(o.StateDir) {
		errs = append(errs, fmt.Errorf("--state-dir %q: must be an absolute path (or empty for the directory of the --endpoint socket)", o.StateDir))
	}
	if o.CgroupRoot != "" && !filepath.IsAbs(o.CgroupRoot) {
		errs = append(errs, fmt.Errorf("--cgroup-root %q: must be an absolute path (or empty to apply no IO limits)", o.CgroupRoot))
	}
	errs = append(errs, o.NodeChannel.Validate())
	return errors.Join(errs...)
}

func (o *NodeOptions) stateDir() (string, error) {
	dir := o.StateDir
	if dir == "" {
		sock, err := csiserver.ParseEndpoint(o.Endpoint)
		if err != nil {
			return "", err
		}
		if dir, err = filepath.Abs(filepath.Dir(sock)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// validateRegistration checks the kubelet registration flags.
func (o *NodeOptions) validateRegistration() []error {
	var errs []error
	dir := o.KubeletRegistrationDir
	if !filepath.IsAbs(dir) {
		errs = append(errs, fmt.Errorf("--kubelet-registration-dir %q: must be an absolute path (or empty to run without a kubelet)", dir))
	} else if sock := registration.SocketPath(dir, o.DriverName); len(sock) > maxSocketPath {
		errs = append(errs, fmt.Errorf("--kubelet-registration-dir %q: the socket %s would be %d bytes long; a unix socket path has at most %d", dir, sock, len(sock), maxSocketPath))
	}
	// The kubelet dials the path as it is: no URL, no relative path.
	switch p := o.KubeletCSISocket; {
	case p == "":
		errs = append(errs, errors.New("--kubelet-csi-socket: must be set when carve registers with the kubelet (--kubelet-registration-dir)"))
	case strings.Contains(p, "://"):
		errs = append(errs, fmt.Errorf("--kubelet-csi-socket %q: must be the socket's path on the host, not a URL", p))
	case !filepath.IsAbs(p):
		errs = append(errs, fmt.Errorf("--kubelet-csi-socket %q: must be an absolute path", p))
	case len(p) > maxSocketPath:
		errs = append(errs, fmt.Errorf("--kubelet-csi-socket %q: %d bytes long; a unix socket path has at most %d", p, len(p), maxSocketPath))
	}
	return errs
}
