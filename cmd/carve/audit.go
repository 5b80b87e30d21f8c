package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/kube"
	"github.com/carve-csi/carve/pkg/pvindex"
	"github.com/carve-csi/carve/pkg/reconcile"
	"github.com/carve-csi/carve/pkg/vgview"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/topology"
)

// viewVolumes shows the state view to the audit with carve's tags read.
type viewVolumes struct{ view *vgview.View }

func (v viewVolumes) Readable(vg string) bool { return v.view.Readable(vg) }

func (v viewVolumes) Volumes() []reconcile.LV {
	lvs := v.view.Volumes()
	out := make([]reconcile.LV, 0, len(lvs))
	for _, lv := range lvs {
		out = append(out, auditLV(lv))
	}
	return out
}

func auditLV(lv lvm.LogicalVolume) reconcile.LV {
	o := volume.OwnerFromTags(lv.Tags)
	return reconcile.LV{VolumeGroup: lv.VolumeGroup, Name: lv.Name, Size: lv.Size,
		Class: o.Class, VolumeName: o.VolumeName, Claim: o.Claim}
}

// nodeAPI is the plugin's access to the Kubernetes API: the PV cache the
// audit and CreateVolume read, and the client the audit writes Events and
// reads claims with.
type nodeAPI struct {
	client kubernetes.Interface
	pvs    *pvindex.Index
}

// startNodeAPI builds the node's API access (nil when --audit-interval is
// 0: then the plugin never calls the API).
func startNodeAPI(o *PluginOptions) (*nodeAPI, error) {
	if o.Audit.Interval == 0 {
		return nil, nil
	}
	client, err := kube.Client(o.Audit.Kubeconfig, "carve-plugin/"+o.NodeName)
	if err != nil {
		return nil, fmt.Errorf("the audit (--audit-interval=0 turns it off): %w", err)
	}
	pvs, err := pvindex.New(client, o.DriverName, topology.Key)
	if err != nil {
		return nil, fmt.Errorf("the PersistentVolume cache: %w", err)
	}
	return &nodeAPI{client: client, pvs: pvs}, nil
}

// startAudit builds the node's audit over api's PV cache; what it returns
// runs the cache and the audit until ctx ends (nil without api).
func startAudit(ctx context.Context, o *PluginOptions, api *nodeAPI, cfg *config.Config, view *vgview.View,
	orphans reconcile.Orphans, reg prometheus.Registerer) func(context.Context) error {
	if api == nil {
		return nil
	}
	classes := make([]reconcile.Class, 0, len(cfg.DeviceClasses))
	for _, d := range cfg.DeviceClasses {
		classes = append(classes, reconcile.Class{Name: d.Name, VolumeGroup: d.VolumeGroup})
	}
	ac := reconcile.Config{Node: o.NodeName, Driver: o.DriverName, TopologyKey: topology.Key, Client: api.client, PVs: api.pvs,
		Volumes: viewVolumes{view}, Classes: classes, Grace: o.Audit.Grace, Interval: o.Audit.Interval,
		Orphans: orphans, RemoveOrphans: o.Audit.RemoveOrphans, Registerer: reg}
	rec, stop := kube.Recorder(ctx, api.client, "carve-plugin", o.NodeName)
	ac.Events = rec
	a := reconcile.New(ac)
	return func(ctx context.Context) error {
		defer stop()
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- api.pvs.Run(ctx) }()
		err := a.Run(ctx)
		cancel()
		return errors.Join(err, <-done)
	}
}
