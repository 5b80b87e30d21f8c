package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/driver"
	"github.com/carve-csi/carve/pkg/fs"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/state"
	"github.com/carve-csi/carve/pkg/version"
)

// mutationSettle is how long the view waits after a mutation before its
// full refresh, so a burst of creates costs one report.
const mutationSettle = 2 * time.Second

// runPlugin wires the real LVM client, mounter, exec and metrics into the
// three CSI servers and serves them on one socket.
func runPlugin(ctx context.Context, o *PluginOptions) error {
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return err
	}
	mm := csimetrics.NewCSIMetricsManagerForPlugin(o.DriverName)
	rec := metrics.NewRecorder(mm.GetRegistry().Registerer())
	lvmClient := lvm.New(lvm.Options{Timeout: o.LVMTimeout, Observer: rec})

	view := state.New(lvmClient, cfg, rec, driver.OwnedClass)
	if err := view.Refresh(ctx); err != nil {
		return err
	}
	// A VG or thin pool named by the file but missing stops the plugin.
	if err := view.Ready(); err != nil {
		return fmt.Errorf("device-class file %s does not match this node: %w", o.ConfigPath, err)
	}
	go view.Run(ctx, o.RefreshInterval, mutationSettle)

	fsTypes := []string{"ext4", "xfs"}
	if _, err := exec.LookPath("mkfs.btrfs"); err == nil {
		fsTypes = append(fsTypes, "btrfs")
	}
	ready := func(context.Context) error { return view.Ready() }
	realExec := utilexec.New()
	services := driver.Services{
		Identity: driver.NewIdentityServer(driver.IdentityConfig{Name: o.DriverName, Version: version.Version,
			Topology: true, Ready: ready}),
		Controller: driver.NewControllerServer(driver.ControllerConfig{NodeName: o.NodeName, Classes: cfg,
			LVM: lvmClient, View: view, FSTypes: fsTypes, Metrics: rec}),
		Node: driver.NewNodeServer(driver.NodeConfig{NodeName: o.NodeName, MaxVolumes: o.MaxVolumes,
			LVM: lvmClient, FS: fs.New(fs.NewHostMounter(realExec), realExec), Metrics: rec, OnChange: view.Changed}),
	}
	return serve(ctx, &o.CommonOptions, services, mm, ready, "node", o.NodeName, "deviceClasses", cfg.Names(), "filesystems", fsTypes)
}

// serve runs the metrics endpoint (if asked) and the gRPC server until ctx
// ends or one of them fails.
func serve(ctx context.Context, o *CommonOptions, svc driver.Services, mm csimetrics.CSIMetricsManager,
	ready func(context.Context) error, logKV ...any) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var metricsDone <-chan error
	if o.MetricsAddress != "" {
		var err error
		if metricsDone, err = serveMetrics(ctx, o.MetricsAddress, mm, ready); err != nil {
			return err
		}
	}
	l, err := driver.Listen(o.Endpoint)
	if err != nil {
		return err
	}
	klog.InfoS("carve started", append([]any{"version", version.Version, "driver", o.DriverName}, logKV...)...)
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- serveGRPC(ctx, driver.NewGRPCServer(svc, mm), l) }()
	select {
	case err := <-metricsDone:
		cancel()
		grpcErr := <-grpcDone
		if err != nil {
			err = fmt.Errorf("metrics server: %w", err)
		}
		return errors.Join(err, grpcErr)
	case err := <-grpcDone:
		return err
	}
}
