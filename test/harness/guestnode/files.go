package guestnode

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// ServiceIP is the apiserver's Service address (the first address of the
// control plane's service range): pods reach the apiserver there, and the
// guest, which runs no kube-proxy, forwards it to the host's apiserver.
const ServiceIP = "10.96.0.1"

// podSubnet is the CNI bridge's range on every node (pods only talk to the
// apiserver, never across nodes).
const podSubnet = "10.88.0.0/16"

// files are what the guest needs in its work directory: the kubelet, the
// images, the configuration and the boot script.
func (n *Node) files() ([]guestvm.File, error) {
	s := n.Spec
	ca, err := os.ReadFile(s.CACert)
	if err != nil {
		return nil, fmt.Errorf("guestnode %s: %w", s.Name, err)
	}
	files := []guestvm.File{
		{Name: "kubelet", Source: s.Kubelet},
		{Name: "config/ca.crt", Data: ca},
		{Name: "config/kubeconfig", Data: []byte(kubeconfig(s.Token))},
		{Name: "config/kubelet.yaml", Data: []byte(kubeletConfig())},
		{Name: "config/kubelet.crt", Data: n.servingCert},
		{Name: "config/kubelet.key", Data: n.servingKey, Mode: 0o600},
		{Name: "config/containerd.toml", Data: []byte(containerdConfig)},
		{Name: "config/cni.conflist", Data: []byte(cniConfig)},
		{Name: "config/first-boot.sh", Data: []byte(s.FirstBoot + "\n")},
	}
	var images []string
	for _, img := range s.Images {
		name := "images/" + filepath.Base(img)
		files = append(files, guestvm.File{Name: name, Source: img, Mode: 0o644})
		images = append(images, name)
	}
	files = append(files, guestvm.File{Name: "node.sh", Data: []byte(bootScript(s, images))})
	return files, nil
}

func kubeconfig(token string) string {
	// The guest reaches the apiserver at a forwarded address that is not in
	// its certificate: check the certificate against the name "kubernetes",
	// which is.
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: host
  cluster:
    server: https://%s:%d
    certificate-authority: %s
    tls-server-name: kubernetes
users:
- name: kubelet
  user:
    token: "%s"
contexts:
- name: host
  context: {cluster: host, user: kubelet}
current-context: host
`, guestvm.GuestForwardIP, GuestAPIServerPort, guestvm.GuestPath("config/ca.crt"), token)
}

// kubeletConfig is a test bed's kubelet: anonymous read of its API (the
// apiserver sends no client certificate here), a serving certificate from
// the host, cgroupfs on cgroup v2, volume statistics every 15 s instead of
// every minute, and a pod resync every 15 s instead of every minute
// (online expansion reaches a running pod's volume at its next resync).
func kubeletConfig() string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
volumeStatsAggPeriod: 15s
syncFrequency: 15s
maxPods: 30
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
rotateCertificates: false
tlsCertFile: ` + guestvm.GuestPath("config/kubelet.crt") + `
tlsPrivateKeyFile: ` + guestvm.GuestPath("config/kubelet.key") + `
`
}

const containerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
`

var cniConfig = `{"cniVersion": "1.0.0", "name": "carve-node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "` + podSubnet + `"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
`

// bootScript is what the guest runs: the node's disks and network, the
// first-boot script, containerd and its images, the kubelet, then a loop
// that runs the host's commands until the host asks it to stop.
func bootScript(s Spec, images []string) string {
	w := guestvm.GuestWorkDir
	var imports strings.Builder
	for _, img := range images {
		marker := "/var/lib/node/imported-" + path.Base(img)
		fmt.Fprintf(&imports, "[ -e %[1]s ] || { ctr -n k8s.io images import %[2]s/%[3]s >> %[2]s/logs/boot.log 2>&1 && : > %[1]s; } || fail 'import %[3]s'\n",
			marker, w, img)
	}
	return fmt.Sprintf(`W=%[1]s
exec >> $W/logs/boot.log 2>&1
log() { echo "$(date +%%T.%%N | cut -c1-12) $*"; }
fail() { log "FAILED: $*"; exit 1; }
log "boot of node %[2]s"
mount -t cgroup2 none /sys/fs/cgroup || fail cgroup2
# The system disk keeps the kubelet's and containerd's state across reboots
# (containerd's overlayfs cannot sit on the guest's overlay root).
blkid /dev/vda > /dev/null || mkfs.ext4 -q -F /dev/vda || fail 'mkfs system disk'
mkdir -p /var/lib/node && mount /dev/vda /var/lib/node || fail 'mount system disk'
# carve's state directory (the DaemonSet's hostPath /var/lib/carve) too.
mkdir -p /var/lib/node/kubelet /var/lib/node/containerd /var/lib/node/carve /var/lib/kubelet /var/lib/containerd /var/lib/carve
mount --bind /var/lib/node/kubelet /var/lib/kubelet && mount --bind /var/lib/node/containerd /var/lib/containerd || fail 'bind mounts'
mount --bind /var/lib/node/carve /var/lib/carve || fail 'bind mount of carve state'
# Bidirectional mount propagation (the CSI plugin's mounts reaching the
# kubelet) needs shared mounts.
mount --make-rshared /
hostname %[2]s
echo "127.0.0.1 localhost" > /etc/hosts
# No lookup may leave the guest.
echo "nameserver 127.0.0.1" > /etc/resolv.conf
ip addr add %[3]s/32 dev eth0 || fail 'node IP'
# No kube-proxy: pods reach the apiserver's Service address through the
# forward to the host.
sysctl -qw net.ipv4.ip_forward=1
for chain in PREROUTING OUTPUT; do
  iptables -t nat -A $chain -d %[4]s/32 -p tcp --dport 443 -j DNAT --to-destination %[5]s:%[6]d || fail "iptables $chain"
done
iptables -t nat -A POSTROUTING -o eth0 -j MASQUERADE || fail 'iptables masquerade'
mkdir -p /etc/cni/net.d && cp $W/config/cni.conflist /etc/cni/net.d/10-carve-node.conflist
if [ ! -e /var/lib/node/first-boot-done ]; then
  log "first boot"
  sh -eu $W/config/first-boot.sh || fail 'first-boot script'
  : > /var/lib/node/first-boot-done
fi
log "containerd"
containerd --config $W/config/containerd.toml >> $W/logs/containerd.log 2>&1 &
i=0; until ctr version > /dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || fail 'containerd did not answer'; sleep 0.2; done
log "images"
%[7]slog "kubelet"
$W/kubelet --config $W/config/kubelet.yaml --kubeconfig $W/config/kubeconfig --hostname-override %[2]s --node-ip %[3]s --v=2 >> $W/logs/kubelet.log 2>&1 &
: > $W/ctl/kubelet-started
while [ ! -e $W/ctl/stop ]; do
  for f in $W/ctl/cmd-*.sh; do
    [ -e "$f" ] || continue
    b=${f%%.sh}
    sh "$f" > "$b.out" 2>&1; echo $? > "$b.rc.tmp"; mv "$b.rc.tmp" "$b.rc"; rm -f "$f"
  done
  sleep 0.1
done
log "stop: sync and power off"
sync
`, w, s.Name, s.NodeIP, ServiceIP, guestvm.GuestForwardIP, GuestAPIServerPort, imports.String())
}
