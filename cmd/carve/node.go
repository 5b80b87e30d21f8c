package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/dmsnapshot"
	"github.com/carve-csi/carve/internal/node/driver"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/iolimit"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/lvmwatch"
	"github.com/carve-csi/carve/internal/node/peercopy"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/registration"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/version"
	"github.com/carve-csi/carve/internal/volume"
)

// mutationSettle is how long the view waits after a mutation before its
// full refresh, so a burst of creates costs one report.
const mutationSettle = 2 * time.Second

// shutdownLVMWait bounds the wait for running lvm mutations at exit: within
// the pod's 30s grace, after the 10s given to CSI calls.
const shutdownLVMWait = 15 * time.Second

const refreshTimeout = 2 * time.Minute

// runNode serves the three CSI servers on one socket, then registers with
// the kubelet and, when asked, serves the node channel. It uses no
// Kubernetes API.
func runNode(ctx context.Context, o *NodeOptions) error {
	cfg, err := deviceclass.Load(o.ConfigPath)
	if err != nil {
		return err
	}
	unfinished, formatting, err := openState(ctx, o)
	if err != nil {
		return err
	}
	mm := newMetricsManager(o.DriverName, "node")
	rec := metrics.NewRecorder(mm.GetRegistry().Registerer())
	lvmClient := lvm.New(lvm.Options{Timeout: o.LVMTimeout, Observer: rec})

	view := startView(ctx, o, cfg, lvmClient, rec)
	fsTypes := fs.Makeable(exec.LookPath)
	ready := func(context.Context) error { return view.Ready() }
	// Probe must not follow a missing class: csi-provisioner waits until Probe
	// says ready, so one absent VG would stop the healthy classes too.
	serving := func(context.Context) error { return view.Serving() }
	realExec := utilexec.New()
	devDir := volume.DevDir(os.Environ())
	pcfg := provision.Config{NodeName: o.NodeName, Classes: cfg,
		LVM: lvmClient, View: view, Metrics: rec, Eraser: erase.Devices{},
		Copier:    blockcopy.Copier{Options: blockcopy.Options{Direct: true}},
		Snapshots: dmsnapshot.Reader{Control: lvmClient.ControlNode()}, Marks: unfinished, Formatting: formatting,
		DevDir: devDir, Changes: &changemap.Finder{Run: changemap.Exec{Exec: realExec}, DevDir: devDir}}
	// Encrypted volumes need cryptsetup and the node channel for their keys.
	var crypt luks.Interface
	if _, err := exec.LookPath("cryptsetup"); err == nil {
		crypt = luks.Cryptsetup{Exec: realExec}
		pcfg.LUKS = crypt
	} else {
		klog.InfoS("cryptsetup not found: this node makes and opens no encrypted volumes")
	}
	var keys *channel.Keys
	var volumeKeys driver.VolumeKeys
	if o.NodeChannel.Address != "" {
		keys = channel.NewKeys()
		volumeKeys = keys
	}
	// Cross-node reads present the node channel's certificate (nodeChannel sets
	// it).
	var puller *peercopy.Puller
	if o.NodeChannel.Address != "" {
		puller = &peercopy.Puller{}
		pcfg.Puller = puller
	}
	node := driver.NewNodeServer(driver.NodeConfig{NodeName: o.NodeName, MaxVolumes: o.MaxVolumes,
		LVM: lvmClient, FS: fs.New(fs.NewHostMounter(realExec), realExec), Metrics: rec,
		Classes: cfg, View: view, Formatting: formatting, Eraser: erase.Devices{}, DevDir: devDir,
		Cgroups: iolimit.Cgroups{Root: o.CgroupRoot}, LUKS: crypt, Keys: volumeKeys})
	controller := driver.NewControllerServer(driver.ControllerConfig{Config: pcfg, FSTypes: fsTypes, Limits: node})
	services := csiserver.Services{
		Identity: csiserver.NewIdentityServer(csiserver.IdentityConfig{Name: o.DriverName, Version: version.Version,
			Topology: true, Ready: serving}),
		Controller: controller,
		Node:       node,
	}
	// Reapply limits changed while the agent was down, or to pod cgroups the
	// kubelet made again.
	go func() {
		if err := node.ReapplyIOLimits(ctx); err != nil {
			klog.ErrorS(err, "Some IO limits could not be applied at start")
		}
	}()
	after := kubeletRegistration(o, registration.NewMetrics(mm.GetRegistry().Registerer()))
	if o.NodeChannel.Address != "" {
		runChannel, err := nodeChannel(o, cfg, view, controller.Provisioner(), services, mm, puller, keys)
		if err != nil {
			return err
		}
		after = append(after, runChannel)
	}
	err = serve(ctx, &o.CommonOptions, socketServices(o, services, serving), mm, ready, after,
		"node", o.NodeName, "deviceClasses", cfg.Names(), "filesystems", fsTypes)
	// An lvm mutation whose call ended keeps running; wait for it, bounded, so
	// the container does not exit under an lvm writing metadata.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownLVMWait)
	defer cancel()
	if werr := lvmClient.Wait(wctx); werr != nil {
		klog.ErrorS(werr, "Exiting with lvm commands still running", "waited", shutdownLVMWait)
	}
	return err
}

// socketServices: the kubelet needs only Identity and Node; the Controller
// service belongs behind the node channel's TLS unless asked for here.
func socketServices(o *NodeOptions, all csiserver.Services, serving func(context.Context) error) csiserver.Services {
	if o.NodeChannel.controllerOnSocket() {
		return all
	}
	local := all
	local.Controller = nil
	local.Identity = csiserver.NewIdentityServer(csiserver.IdentityConfig{Name: o.DriverName, Version: version.Version,
		Topology: true, Ready: serving, NoController: true})
	return local
}

// startView reads the VGs once and keeps the view current: periodic
// refresh and, when asked, the LVM backup watch.
func startView(ctx context.Context, o *NodeOptions, cfg *deviceclass.Config, lvmClient *lvm.Client, rec *metrics.Recorder) *vgview.View {
	view := vgview.New(lvmClient, cfg, rec)
	// A node whose VG cannot be read still serves (exiting would only loop the
	// pod): its classes have no room, /readyz says why, and the refresh notices
	// the fix.
	if err := view.Refresh(ctx); err != nil {
		klog.ErrorS(err, "Reading LVM failed; serving anyway, not ready until a refresh succeeds")
	} else if err := view.Ready(); err != nil {
		klog.ErrorS(err, "The device-class file names volume groups or thin pools this node lacks; serving anyway, not ready until they appear", "config", o.ConfigPath)
	}
	for _, c := range view.UnzeroedThinClasses() {
		// Not fatal (pools made with --zero n on purpose), but loud: the metric and
		// CarveThinPoolNotZeroing show it.
		klog.ErrorS(nil, "The thin pool of this device class does not zero new blocks: a new volume can read data a deleted volume wrote; "+
			"run `lvchange --zero y <vg>/<pool>`", "deviceClass", c)
	}
	// A hung lvm shows once no report came back for three intervals and a
	// refresh's timeout.
	view.StaleAfter(3*o.RefreshInterval + refreshTimeout)
	go view.Run(ctx, o.RefreshInterval, mutationSettle)
	if o.WatchLVMBackups {
		dir := lvmwatch.BackupDir(os.Getenv)
		go func() {
			if err := lvmwatch.Watch(ctx, dir, cfg.VolumeGroups(), func(string) { view.Changed() }); err != nil {
				klog.ErrorS(err, "Not watching LVM metadata backups; changes made outside carve show on the periodic refresh", "dir", dir)
			}
		}()
	}
	return view
}

// kubeletRegistration registers with the kubelet (none without
// --kubelet-registration-dir).
func kubeletRegistration(o *NodeOptions, m *registration.Metrics) []func(context.Context) error {
	if o.KubeletRegistrationDir == "" {
		m.Set(registration.StateDisabled)
		klog.InfoS("Not registering with a kubelet: --kubelet-registration-dir is empty")
		return nil
	}
	srv := registration.New(registration.Config{Dir: o.KubeletRegistrationDir, DriverName: o.DriverName,
		CSISocket: o.KubeletCSISocket, Metrics: m})
	return []func(context.Context) error{func(ctx context.Context) error {
		if err := srv.Run(ctx); err != nil {
			return fmt.Errorf("--kubelet-registration-dir %s: %w", o.KubeletRegistrationDir, err)
		}
		return nil
	}}
}

// serve runs the metrics endpoint, the gRPC server and, once the socket
// listens, each of after, until ctx ends or one fails; it returns when all
// returned.
func serve(ctx context.Context, o *CommonOptions, svc csiserver.Services, mm csimetrics.CSIMetricsManager,
	ready func(context.Context) error, after []func(context.Context) error, logKV ...any) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var metricsDone <-chan error
	if o.MetricsAddress != "" {
		var err error
		if metricsDone, err = serveMetrics(ctx, o.MetricsAddress, mm, ready); err != nil {
			return err
		}
	}
	l, err := csiserver.Listen(o.Endpoint)
	if err != nil {
		return err
	}
	klog.InfoS("carve started", append([]any{"version", version.Version, "driver", o.DriverName}, logKV...)...)
	running := 1 + len(after)
	done := make(chan error, running)
	go func() { done <- serveGRPC(ctx, csiserver.NewGRPCServer(svc, mm), l) }()
	for _, run := range after {
		go func() { done <- run(ctx) }()
	}
	var errs []error
	select {
	case err := <-metricsDone:
		if err != nil {
			errs = append(errs, fmt.Errorf("metrics server: %w", err))
		}
	case err := <-done:
		running--
		errs = append(errs, err)
	}
	// Stop the others and wait: the registration socket must be gone before
	// carve exits.
	cancel()
	for ; running > 0; running-- {
		errs = append(errs, <-done)
	}
	return errors.Join(errs...)
}
