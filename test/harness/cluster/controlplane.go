package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
)

// ControlPlane is a running etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager.
type ControlPlane struct {
	// Kubeconfig is the admin kubeconfig file (a token in system:masters).
	Kubeconfig string
	// Config is the admin REST config.
	Config *rest.Config
	// Server is the apiserver's URL.
	Server string

	pki       *pki
	processes []*Process
}

// controlPlaneOptions are what differs between test beds.
type controlPlaneOptions struct {
	// nodeLifecycle runs kube-controller-manager's node lifecycle
	// controller: right when every node has a kubelet that heartbeats,
	// wrong for simulated nodes (it would taint them unreachable).
	nodeLifecycle bool
	// kubeletProxy, when set, is the unix socket of an HTTP CONNECT proxy
	// through which the apiserver reaches kubelets (by their InternalIP),
	// for logs, exec and port-forward.
	kubeletProxy string
}

// startControlPlane starts the control plane from the binaries in binDir,
// with files under dir, each process living at most lifetime. On error,
// whatever was started is stopped again.
func startControlPlane(ctx context.Context, binDir, dir string, lifetime time.Duration, opts controlPlaneOptions) (cp *ControlPlane, err error) {
	cp = &ControlPlane{}
	defer func() {
		if err != nil {
			cp.dumpLogs(40)
			cp.Stop()
		}
	}()
	pkiDir := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return cp, err
	}
	if cp.pki, err = newPKI(pkiDir, lifetime+time.Hour); err != nil {
		return cp, fmt.Errorf("keys and certificates: %w", err)
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return cp, err
		}
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	logs := filepath.Join(dir, "logs")

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	etcd, err := startProcess(ctx, logs, "etcd", filepath.Join(binDir, "etcd"), []string{
		"--name", "e2e",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e=" + peerURL,
		// A throw-away store: durability buys nothing here.
		"--unsafe-no-fsync",
	}, nil, lifetime)
	if err != nil {
		return cp, err
	}
	cp.processes = append(cp.processes, etcd)

	cp.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	var apiExtra []string
	if opts.kubeletProxy != "" {
		egress := filepath.Join(dir, "egress-selector.yaml")
		if err := os.WriteFile(egress, []byte(egressSelectorConfig(opts.kubeletProxy)), 0o644); err != nil {
			return cp, err
		}
		apiExtra = []string{"--egress-selector-config-file", egress, "--kubelet-preferred-address-types", "InternalIP"}
	}
	api, err := startProcess(ctx, logs, "kube-apiserver", filepath.Join(binDir, "kube-apiserver"), append([]string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		"--tls-cert-file", cp.pki.ServingCert, "--tls-private-key-file", cp.pki.ServingKey,
		"--client-ca-file", cp.pki.CACert,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", cp.pki.SAPub,
		"--service-account-signing-key-file", cp.pki.SAKey,
		"--token-auth-file", cp.pki.TokenFile,
		"--authorization-mode", "Node,RBAC",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--allow-privileged",
	}, apiExtra...), nil, lifetime)
	if err != nil {
		return cp, err
	}
	cp.processes = append(cp.processes, api)

	cp.Config = &rest.Config{
		Host:            cp.Server,
		BearerToken:     cp.pki.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: cp.pki.CACert},
		QPS:             100,
		Burst:           200,
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.Server, cp.pki.CACert, "admin", cp.pki.AdminToken); err != nil {
		return cp, err
	}
	if err := cp.waitReady(ctx, api, 90*time.Second); err != nil {
		return cp, err
	}

	common := []string{
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig,
		"--authorization-kubeconfig", cp.Kubeconfig,
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		// Nothing here reads the scheduler's or the controller manager's
		// own endpoints, and a port found free may be taken (by one of the
		// apiserver's connections, say) before the process binds it,
		// which ends the process.
		"--secure-port=0",
	}
	sched, err := startProcess(ctx, logs, "kube-scheduler", filepath.Join(binDir, "kube-scheduler"), common, nil, lifetime)
	if err != nil {
		return cp, err
	}
	cp.processes = append(cp.processes, sched)
	controllers := "*"
	if !opts.nodeLifecycle {
		// No kubelet heartbeats simulated nodes: the node lifecycle
		// controller would mark them NotReady and taint them.
		controllers = "*,-node-lifecycle-controller"
	}
	kcm, err := startProcess(ctx, logs, "kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"),
		append(common,
			"--controllers", controllers,
			"--root-ca-file", cp.pki.CACert,
			"--service-account-private-key-file", cp.pki.SAKey,
			"--use-service-account-credentials=false",
		), nil, lifetime)
	if err != nil {
		return cp, err
	}
	cp.processes = append(cp.processes, kcm)
	klog.InfoS("Control plane up", "server", cp.Server, "kubeconfig", cp.Kubeconfig)
	return cp, nil
}

// waitReady polls the apiserver's /readyz until it answers ok, the process
// ends, or timeout passes.
func (cp *ControlPlane) waitReady(ctx context.Context, api *Process, timeout time.Duration) error {
	caPEM, err := os.ReadFile(cp.pki.CACert)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if ended, werr := api.Exited(); ended {
			return fmt.Errorf("kube-apiserver exited (%w) before it was ready", werr)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.Server+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cp.pki.AdminToken)
		resp, err := client.Do(req)
		if err == nil {
			// Only the status matters; a failed close only loses this connection.
			if cerr := resp.Body.Close(); cerr != nil {
				klog.V(2).InfoS("Closing a readyz answer failed", "err", cerr)
			}
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready within %s (last answer: %s)", timeout, last)
}

// Stop stops the control plane in reverse start order.
func (cp *ControlPlane) Stop() {
	for i := len(cp.processes) - 1; i >= 0; i-- {
		cp.processes[i].Stop()
	}
	cp.processes = nil
}

// Process returns the control-plane process of that name (etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager), or nil: a
// benchmark reads its CPU and memory from /proc.
func (cp *ControlPlane) Process(name string) *Process {
	for _, p := range cp.processes {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// dumpLogs writes the tail of every process's log to the klog output.
func (cp *ControlPlane) dumpLogs(lines int) {
	for _, p := range cp.processes {
		fmt.Fprintf(os.Stderr, "----- last %d lines of %s (%s)\n%s\n", lines, p.Name, p.LogPath, p.Tail(lines))
	}
}

// checkAlive returns an error naming every control-plane process that ended.
func (cp *ControlPlane) checkAlive() error {
	var dead []string
	for _, p := range cp.processes {
		if ended, err := p.Exited(); ended {
			dead = append(dead, fmt.Sprintf("%s (%v)", p.Name, err))
		}
	}
	if len(dead) > 0 {
		return fmt.Errorf("control-plane processes ended: %s", strings.Join(dead, ", "))
	}
	return nil
}

// egressSelectorConfig sends the apiserver's traffic to nodes (kubelets)
// through an HTTP CONNECT proxy on a unix socket.
func egressSelectorConfig(socket string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, socket)
}

func writeKubeconfig(path, server, caFile, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}
