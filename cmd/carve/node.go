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

// shutdownLVMWait bounds how long the plugin waits at exit for lvm
// mutations still running: within the pod's default 30 s grace, after the
// 10 s given to in-flight CSI calls.
const shutdownLVMWait = 15 * time.Second

// refreshTimeout is what vgview.View.Run gives one refresh.
const refreshTimeout = 2 * time.Minute

// runNode wires the real LVM client, mounter, exec and metrics into the
// three CSI servers, serves them on one socket and, once that listens,
// registers the plugin with the kubelet and, when asked, serves the node
// channel. It uses no Kubernetes API: no client is built on this path.
func runNode(ctx context.Context, o *NodeOptions) error {
	cfg, err := deviceclass.Load(o.ConfigPath)
	if err != nil {
		return err
	}
	// Volumes being made, and filesystems being made on them.
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
	// Probe must not follow a missing class: csi-provisioner waits at start
	// until Probe says ready, so one absent volume group would stop the healthy
	// classes too. /readyz reports the missing class.
	serving := func(context.Context) error { return view.Serving() }
	realExec := utilexec.New()
	// Where lvm makes device nodes, read once, as lvm.New read it.
	devDir := volume.DevDir(os.Environ())
	pcfg := provision.Config{NodeName: o.NodeName, Classes: cfg,
		LVM: lvmClient, View: view, Metrics: rec, Eraser: erase.Devices{},
		Copier:    blockcopy.Copier{Options: blockcopy.Options{Direct: true}},
		Snapshots: dmsnapshot.Reader{Control: lvmClient.ControlNode()}, Marks: unfinished, Formatting: formatting,
		DevDir: devDir, Changes: &changemap.Finder{Run: changemap.Exec{Exec: realExec}, DevDir: devDir}}
	// Encrypted volumes need cryptsetup (in carve's image) and the node
	// channel, over which carve controller releases their keys.
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
	// Reads of restores' and clones' sources on other nodes present the
	// node channel's certificate: nodeChannel fills it in.
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
	// Limits changed while the agent was down, or pod cgroups the
	// kubelet made again, get the volumes' limits now; failures are
	// logged and counted by ReapplyIOLimits.
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
	// An lvm mutation whose CSI call ended (deadline, or the 10 s
	// shutdown grace) keeps running and is never killed; wait for it
	// within a bound, so that the container does not exit under an lvm
	// that is writing metadata (its children die with it).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownLVMWait)
	defer cancel()
	if werr := lvmClient.Wait(wctx); werr != nil {
		klog.ErrorS(werr, "Exiting with lvm commands still running", "waited", shutdownLVMWait)
	}
	return err
}

// socketServices are the services of the --endpoint socket: all of them,
// or without the node channel's Controller service unless asked. The
// kubelet needs only Identity and Node; the Controller service belongs
// behind the node channel's TLS and enrollment.
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

// startView reads the node's volume groups once and keeps the view of them
// current from then on: the periodic refresh and, when asked, the watch of
// LVM's metadata backups.
func startView(ctx context.Context, o *NodeOptions, cfg *deviceclass.Config, lvmClient *lvm.Client, rec *metrics.Recorder) *vgview.View {
	view := vgview.New(lvmClient, cfg, rec)
	// A node whose volume group or LVM cannot be read still serves (exiting
	// would only restart the pod in a loop): its classes have no room, /readyz
	// says why, and the periodic refresh notices the fix.
	if err := view.Refresh(ctx); err != nil {
		klog.ErrorS(err, "Reading LVM failed; serving anyway, not ready until a refresh succeeds")
	} else if err := view.Ready(); err != nil {
		klog.ErrorS(err, "The device-class file names volume groups or thin pools this node lacks; serving anyway, not ready until they appear", "config", o.ConfigPath)
	}
	for _, c := range view.UnzeroedThinClasses() {
		// Not fatal (admins make pools with --zero n for speed, on
		// purpose), but loud: carve_thin_pool_zeroing is 0 for the
		// class and CarveThinPoolNotZeroing fires.
		klog.ErrorS(nil, "The thin pool of this device class does not zero new blocks: a new volume can read data a deleted volume wrote; "+
			"run `lvchange --zero y <vg>/<pool>`", "deviceClass", c)
	}
	// Not ready once no report has come back for three refresh intervals
	// and the longest a refresh may take: a hung lvm shows.
	view.StaleAfter(3*o.RefreshInterval + refreshTimeout)
	go view.Run(ctx, o.RefreshInterval, mutationSettle)
	if o.WatchLVMBackups {
		dir := lvmwatch.BackupDir(os.Getenv)
		go func() {
			// Without the watch, changes made outside carve still show
			// after --capacity-refresh-interval.
			if err := lvmwatch.Watch(ctx, dir, cfg.VolumeGroups(), func(string) { view.Changed() }); err != nil {
				klog.ErrorS(err, "Not watching LVM metadata backups; changes made outside carve show on the periodic refresh", "dir", dir)
			}
		}()
	}
	return view
}

// kubeletRegistration returns what registers the plugin with the kubelet
// (none when --kubelet-registration-dir is empty); m shows the state.
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

// serve runs the metrics endpoint (if asked), the gRPC server and, once the
// CSI socket listens, each of after (which run until ctx ends), until ctx
// ends or one of them fails; it returns when all of them returned.
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
	// One ended: stop the others, and wait for them (the registration
	// socket must be gone before carve exits).
	cancel()
	for ; running > 0; running-- {
		errs = append(errs, <-done)
	}
	return errors.Join(errs...)
}
