//go:build hosttest

package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/carve-csi/carve/test/harness/guestvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The carve node binary against a real VG on a loop device, activation
// disabled: the controller side (create, capacity, list, delete, restart)
// works with LVM metadata alone. The node side needs device-mapper and runs
// in the guest tier.

const (
	pluginNode  = "host-node"
	pluginSpare = 128 * mib
)

func buildCarve(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "carve")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := guestvm.BuildBinary(ctx, "github.com/carve-csi/carve/cmd/carve", nil, bin); err != nil {
		t.Fatalf("building carve: %v", err)
	}
	return bin
}

func startPlugin(t *testing.T, bin, dir string, vg *lvmtest.LoopVG, config string) *plugintest.Plugin {
	t.Helper()
	p, err := plugintest.Start(ctxFor(t), plugintest.Options{Binary: bin, Dir: dir, NodeName: pluginNode,
		Config: config, Env: vg.Env(), Log: testLog{t}, ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatalf("starting the plugin: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	return p
}

// startRefreshingPlugin starts the plugin with config over vg's
// environment, its capacity refreshed every second; stop stops it,
// failing t when it does not stop.
func startRefreshingPlugin(t *testing.T, bin, dir string, vg *lvmtest.LoopVG, config string) (p *plugintest.Plugin, stop func()) {
	t.Helper()
	p, err := plugintest.Start(ctxFor(t), plugintest.Options{Binary: bin, Dir: dir, NodeName: pluginNode,
		Config: config, Env: vg.Env(), Log: testLog{t}, ReadyTimeout: time.Minute,
		ExtraArgs: []string{"--capacity-refresh-interval", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	return p, func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stop the plugin: %v", err)
		}
	}
}

// testLog forwards the plugin's log lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func thickConfig(vg string) string {
	return fmt.Sprintf("deviceClasses:\n  - name: fast\n    volumeGroup: %s\n    default: true\n    spare: %d\n", vg, pluginSpare)
}

func TestPluginControllerOnRealLVM(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 1 << 30})
	bin := buildCarve(t)
	dir := t.TempDir()
	p := startPlugin(t, bin, dir, vg, thickConfig(vg.Name))
	ctx := ctxFor(t)
	cc := csi.NewControllerClient(p.Conn)

	capacity := func() int64 {
		t.Helper()
		rsp, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{})
		if err != nil {
			t.Fatalf("GetCapacity: %v", err)
		}
		return rsp.GetAvailableCapacity()
	}
	vgFree := func() uint64 {
		t.Helper()
		s, err := plugintest.ReadVG(ctx, vg)
		if err != nil {
			t.Fatal(err)
		}
		return s.Free
	}
	// GetCapacity is vgs's free space minus the spare.
	if got, want := capacity(), int64(vgFree())-pluginSpare; got != want {
		t.Fatalf("GetCapacity = %d, vgs free - spare = %d", got, want)
	}

	req := &csi.CreateVolumeRequest{
		Name:               "pvc-host-1",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 100*mib + 1},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:         map[string]string{"csi.storage.k8s.io/pvc/name": "data"},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{
			{Segments: map[string]string{"topology.carve.dev/node": pluginNode}}}},
	}
	rsp, err := cc.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id := rsp.GetVolume().GetVolumeId()
	if rsp.GetVolume().GetCapacityBytes() != 104*mib {
		t.Errorf("capacity %d, want 100 MiB + 1 rounded up to 4 MiB extents", rsp.GetVolume().GetCapacityBytes())
	}
	lvs, err := plugintest.CarveLVs(ctx, vg)
	if err != nil || len(lvs) != 1 || vg.Name+"/"+lvs[0] != id {
		t.Fatalf("carve LVs in LVM %v (%v); volume ID %s", lvs, err, id)
	}
	if got, want := capacity(), int64(vgFree())-pluginSpare; got != want {
		t.Errorf("after create: GetCapacity = %d, vgs free - spare = %d", got, want)
	}

	again, err := cc.CreateVolume(ctx, req)
	if err != nil || again.GetVolume().GetVolumeId() != id {
		t.Errorf("repeated CreateVolume: %v, %v", again, err)
	}
	big := &csi.CreateVolumeRequest{Name: "pvc-too-big", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: req.VolumeCapabilities}
	if _, err := cc.CreateVolume(ctx, big); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume beyond the VG: %v, want ResourceExhausted", err)
	}
	other := proto(req)
	other.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{
		{Segments: map[string]string{"topology.carve.dev/node": "elsewhere"}}}}
	other.Name = "pvc-elsewhere"
	if _, err := cc.CreateVolume(ctx, other); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume for another node: %v, want ResourceExhausted", err)
	}

	checkMetrics(ctx, t, p, []string{"create", "capacity"}, []string{"lvcreate"}, "CreateVolume")

	// A restarted plugin finds the volume through its tags.
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping the plugin: %v", err)
	}
	p = startPlugin(t, bin, dir, vg, thickConfig(vg.Name))
	cc = csi.NewControllerClient(p.Conn)
	list, err := cc.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("ListVolumes after restart: %v, %v", list, err)
	}
	again, err = cc.CreateVolume(ctx, req)
	if err != nil || again.GetVolume().GetVolumeId() != id {
		t.Errorf("CreateVolume after restart: %v, %v", again, err)
	}
	if _, err := cc.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("ControllerGetVolume: %v", err)
	}

	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if lvs, err := plugintest.CarveLVs(ctx, vg); err != nil || len(lvs) != 0 {
		t.Errorf("carve LVs after delete: %v, %v", lvs, err)
	}
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("second DeleteVolume: %v", err)
	}
	if got, want := capacity(), int64(vgFree())-pluginSpare; got != want {
		t.Errorf("after delete: GetCapacity = %d, vgs free - spare = %d", got, want)
	}

	// The metrics of this process show the phases that ran in it, and the
	// VG as vgs sees it.
	checkMetrics(ctx, t, p, []string{"delete", "capacity"}, []string{"lvremove"}, "DeleteVolume")
	free, ok, err := scrape(ctx, t, p).Gauge("carve_volume_group_free_bytes", map[string]string{"device_class": "fast", "volume_group": vg.Name})
	if err != nil || !ok || uint64(free) != vgFree() {
		t.Errorf("carve_volume_group_free_bytes = %v (%v, %v), vgs says %d", free, ok, err, vgFree())
	}
}

func scrape(ctx context.Context, t *testing.T, p *plugintest.Plugin) plugintest.Metrics {
	t.Helper()
	ms, err := p.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// checkMetrics asserts successful phases, steps, lvm commands (named like
// the steps) and one CSI method in the plugin's /metrics.
func checkMetrics(ctx context.Context, t *testing.T, p *plugintest.Plugin, phases, steps []string, method string) {
	t.Helper()
	ms := scrape(ctx, t, p)
	for _, phase := range phases {
		if n := ms.HistogramCount("carve_phase_duration_seconds", map[string]string{"phase": phase, "device_class": "fast", "result": "OK"}); n == 0 {
			t.Errorf("no successful %s phase in carve_phase_duration_seconds", phase)
		}
	}
	for _, step := range steps {
		if n := ms.HistogramCount("carve_step_duration_seconds", map[string]string{"step": step, "device_class": "fast", "result": "success"}); n == 0 {
			t.Errorf("no %s step in carve_step_duration_seconds", step)
		}
		if n := ms.HistogramCount("carve_lvm_command_duration_seconds", map[string]string{"command": step, "result": "success"}); n == 0 {
			t.Errorf("no %s command in carve_lvm_command_duration_seconds", step)
		}
	}
	if n := ms.HistogramCount("csi_plugin_operations_seconds", map[string]string{"method_name": "/csi.v1.Controller/" + method, "grpc_status_code": "OK", "driver_name": "lvm.carve.dev"}); n == 0 {
		t.Errorf("csi_plugin_operations_seconds has no successful %s", method)
	}
}

// proto copies a request (shallow: the tests only replace top-level fields).
func proto(r *csi.CreateVolumeRequest) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{Name: r.Name, CapacityRange: r.CapacityRange,
		VolumeCapabilities: r.VolumeCapabilities, Parameters: r.Parameters,
		AccessibilityRequirements: r.AccessibilityRequirements}
}

// TestPluginRefusesBadFile: a device-class file that does not parse stops
// the plugin with a message naming the problem.
func TestPluginRefusesBadFile(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 256 * mib})
	bin := buildCarve(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("deviceClasses:\n  - {name: a, volumeGroup: %s, sparee: 1Gi}\n", vg.Name)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctxFor(t), bin, "node", "--node-name", pluginNode, "--kubelet-registration-dir=",
		"--config", cfg, "--endpoint", "unix://"+filepath.Join(dir, "csi.sock"))
	cmd.Env = append(os.Environ(), vg.Env()...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the plugin did not exit with status 1 (%v); output:\n%s", err, out)
	}
	if want := `unknown field "deviceClasses[0].sparee"`; !strings.Contains(string(out), want) {
		t.Errorf("output does not say %q:\n%s", want, out)
	}
}

// httpGet returns the status and body of url.
func httpGet(ctx context.Context, t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	rsp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() {
		if err := rsp.Body.Close(); err != nil {
			t.Errorf("GET %s: close: %v", url, err)
		}
	}()
	body, err := io.ReadAll(rsp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return rsp.StatusCode, string(body)
}

// TestPluginServesWithoutItsVolumeGroup: a device-class file naming a
// volume group or thin pool the node lacks does not stop the plugin (its
// pod would restart in a loop): it serves, /healthz (liveness) answers
// 200, /readyz 503 with the reason code of what is missing, Probe is not ready, GetCapacity
// is 0, and it registers with the kubelet all the same (a fake kubelet
// here). SIGTERM stops it cleanly and removes the registration socket.
func TestPluginServesWithoutItsVolumeGroup(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 256 * mib})
	bin := buildCarve(t)
	tests := []struct {
		name   string
		config string
		want   string
		// class is the device class that is unavailable, with its volume
		// group and the reason carve_device_class_available gives.
		class, volumeGroup, reason string
	}{
		{"missing VG", thickConfig("carve-no-such-vg"), "not ready: vg-missing\n", "fast", "carve-no-such-vg", "vg-missing"},
		{"thin pool missing", fmt.Sprintf("deviceClasses:\n  - {name: thin, volumeGroup: %s, thinPool: pool0}\n", vg.Name), "not ready: thin-pool-missing\n",
			"thin", vg.Name, "thin-pool-missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxFor(t)
			regDir := t.TempDir()
			const hostCSISocket = "/var/lib/kubelet/plugins/lvm.carve.dev/csi.sock"
			p, err := plugintest.Start(ctx, plugintest.Options{Binary: bin, Dir: t.TempDir(), NodeName: pluginNode,
				Config: tt.config, Env: vg.Env(), Log: testLog{t}, ReadyTimeout: time.Minute, NotReadyOK: true,
				ExtraArgs: []string{"--kubelet-registration-dir", regDir, "--kubelet-csi-socket", hostCSISocket}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := p.Stop(10 * time.Second); err != nil {
					t.Errorf("stop the plugin: %v", err)
				}
			}()
			base := strings.TrimSuffix(p.MetricsURL, "/metrics")
			if code, body := httpGet(ctx, t, base+"/healthz"); code != http.StatusOK {
				t.Errorf("/healthz: %d %q, want 200 (liveness does not depend on the volume groups)", code, body)
			}
			if code, body := httpGet(ctx, t, base+"/readyz"); code != http.StatusServiceUnavailable || body != tt.want {
				// The reason code only: /readyz answers anyone on the pod IP.
				t.Errorf("/readyz: %d %q, want 503 saying %q", code, body, tt.want)
			}
			// Probe stays ready: csi-provisioner waits on it at start, and
			// must run to publish the zero capacity.
			rsp, err := csi.NewIdentityClient(p.Conn).Probe(ctx, &csi.ProbeRequest{})
			if err != nil || !rsp.GetReady().GetValue() {
				t.Errorf("Probe: ready=%v, %v; want ready (a missing class shows in /readyz, not in Probe)", rsp.GetReady().GetValue(), err)
			}
			if c, err := csi.NewControllerClient(p.Conn).GetCapacity(ctx, &csi.GetCapacityRequest{}); err != nil || c.GetAvailableCapacity() != 0 {
				t.Errorf("GetCapacity: %v, %v; want 0", c.GetAvailableCapacity(), err)
			}
			// The unavailable class has a series (and an alert), not none.
			if v, ok, err := scrape(ctx, t, p).Gauge("carve_device_class_available",
				map[string]string{"device_class": tt.class, "volume_group": tt.volumeGroup, "reason": tt.reason}); err != nil || !ok || v != 0 {
				t.Errorf(`carve_device_class_available{device_class=%q,reason=%q} = %v (present %v, %v), want 0`, tt.class, tt.reason, v, ok, err)
			}

			// The kubelet's side of the registration.
			sock := filepath.Join(regDir, "lvm.carve.dev-reg.sock")
			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := conn.Close(); err != nil {
					t.Error(err)
				}
			}()
			kubelet := registerapi.NewRegistrationClient(conn)
			info, err := kubelet.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("GetInfo: %v", err)
			}
			if info.GetType() != registerapi.CSIPlugin || info.GetName() != "lvm.carve.dev" || info.GetEndpoint() != hostCSISocket {
				t.Errorf("GetInfo = %+v, want CSIPlugin lvm.carve.dev at %s", info, hostCSISocket)
			}
			if _, err := kubelet.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
				t.Fatalf("NotifyRegistrationStatus: %v", err)
			}
			if v, ok, err := scrape(ctx, t, p).Gauge("carve_kubelet_registration", map[string]string{"state": "registered"}); err != nil || !ok || v != 1 {
				t.Errorf(`carve_kubelet_registration{state="registered"} = %v (present %v, %v), want 1`, v, ok, err)
			}
			if err := p.Stop(10 * time.Second); err != nil {
				t.Errorf("the plugin did not stop cleanly on SIGTERM: %v", err)
			}
			if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the registration socket outlived the plugin (%v): the kubelet would not deregister it", err)
			}
		})
	}
}

// TestPluginReadinessFollowsVG: /readyz turns 503 when the VG disappears
// after start-up (here: renamed) and the periodic refresh sees it, while
// Probe stays ready (csi-provisioner must keep serving the other classes).
func TestPluginReadinessFollowsVG(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 256 * mib})
	bin := buildCarve(t)
	dir := t.TempDir()
	p, stop := startRefreshingPlugin(t, bin, dir, vg, thickConfig(vg.Name))
	defer stop()
	ctx := ctxFor(t)
	class := map[string]string{"device_class": "fast", "volume_group": vg.Name}
	if v, ok, err := scrape(ctx, t, p).Gauge("carve_device_class_available", class); err != nil || !ok || v != 1 {
		t.Errorf("carve_device_class_available of the class before the VG vanished = %v (present %v, %v), want 1", v, ok, err)
	}
	if _, err := vg.LVM(ctx, "vgrename", vg.Name, vg.Name+"x"); err != nil {
		t.Fatalf("vgrename: %v", err)
	}
	defer func() {
		// Back to its name, so the VG's cleanup finds it.
		if _, err := vg.LVM(context.Background(), "vgrename", vg.Name+"x", vg.Name); err != nil {
			t.Errorf("vgrename back: %v", err)
		}
	}()
	readyz := strings.TrimSuffix(p.MetricsURL, "/metrics") + "/readyz"
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := httpGet(ctx, t, readyz)
		if code == http.StatusServiceUnavailable {
			// The reason code only: /readyz answers anyone on the pod IP,
			// and the VG's name is the log's to say.
			if body != "not ready: vg-missing\n" {
				t.Fatalf("/readyz after the VG vanished: %q, want the reason code alone", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %q 30 s after the VG vanished", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	class["reason"] = "vg-missing"
	if v, ok, err := scrape(ctx, t, p).Gauge("carve_device_class_available", class); err != nil || !ok || v != 0 {
		t.Errorf(`carve_device_class_available{reason="vg-missing"} after the VG vanished = %v (present %v, %v), want 0`, v, ok, err)
	}
	rsp, err := csi.NewIdentityClient(p.Conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !rsp.GetReady().GetValue() {
		t.Errorf("Probe after the VG vanished: ready=%v, %v; want ready", rsp.GetReady().GetValue(), err)
	}
	capResp, err := csi.NewControllerClient(p.Conn).GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || capResp.GetAvailableCapacity() != 0 {
		t.Errorf("GetCapacity of a vanished VG: %v, %v; want 0", capResp.GetAvailableCapacity(), err)
	}
}

// TestPluginBenchHost times the plugin through its socket against the raw
// commands it wraps, on the same VG in the same run, and prints ratios (no
// timed assertions). Activation is off here, so lvcreate does no device
// work; the guest tier's `make bench` gives the figures with activation.
func TestPluginBenchHost(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 1 << 30})
	bin := buildCarve(t)
	p := startPlugin(t, bin, t.TempDir(), vg, thickConfig(vg.Name))
	ctx := ctxFor(t)
	cc := csi.NewControllerClient(p.Conn)
	const rounds = 15
	var raw, plugin time.Duration
	// Interleaved, so drift on the machine hits both sides alike.
	for i := range rounds {
		start := time.Now()
		rawCreateRemove(ctx, t, vg, fmt.Sprintf("raw%d", i), 67108864)
		raw += time.Since(start)

		start = time.Now()
		rsp, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("bench-%d", i),
			CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: rsp.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		plugin += time.Since(start)
	}
	t.Logf("BENCH host create+delete: plugin %v/op, raw lvcreate+lvremove %v/op, ratio %.3f",
		plugin/rounds, raw/rounds, float64(plugin)/float64(raw))

	const capRounds = 200
	var vgsTime, capTime time.Duration
	for range 10 {
		start := time.Now()
		if _, err := plugintest.ReadVG(ctx, vg); err != nil {
			t.Fatal(err)
		}
		vgsTime += time.Since(start)
	}
	start := time.Now()
	for range capRounds {
		if _, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	capTime = time.Since(start)
	perVgs, perCap := vgsTime/10, capTime/capRounds
	t.Logf("BENCH host GetCapacity: %v/op through the socket, one raw vgs %v, vgs/GetCapacity %.0fx",
		perCap, perVgs, float64(perVgs)/float64(perCap))
}
