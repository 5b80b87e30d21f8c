package audit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Event reasons of volume health, on the claim (on the PV when unbound).
const (
	ReasonVolumeAbnormal  = "VolumeAbnormal"
	ReasonVolumeRecovered = "VolumeRecovered"
)

// Health reasons the audit judges itself.
const (
	// healthInactive is no problem: without LVM autoactivation every LV is
	// inactive after a reboot, and staging activates it.
	healthInactive = "LogicalVolumeInactive"
	// healthMissing is the audit's own: a PV's LV gone for the grace period.
	healthMissing = "LogicalVolumeMissing"
)

// VolumeHealth is a node's report of one volume with a problem.
type VolumeHealth struct {
	// ID is the volume's ID, its PV's handle.
	ID       string
	Problems []Problem
}

// Problem is one entry of a volume's health.
type Problem struct {
	// Status is the CSI health type, Reason carve's word for it, Message the
	// node's sentence.
	Status, Reason, Message string
}

type abnormal struct {
	pv PV
	// reasons are the sorted, joined reasons: a new set is announced anew, the
	// same one (with moved numbers) is not.
	reasons string
}

// judgeHealth announces PVs that turned abnormal (a Warning on the claim)
// or recovered (a Normal, once), and publishes the node's count.
func (a *Auditor) judgeHealth(log klog.Logger, na *nodeAudit, inv *Inventory, pvs []PV, health []VolumeHealth, missing []Missing) {
	byHandle, byName := map[string]PV{}, map[string]PV{}
	for _, pv := range pvs {
		if pv.Node == na.node && !pv.Going && pv.Handle != "" {
			byHandle[pv.Handle], byName[pv.Name] = pv, pv
		}
	}
	problems := map[string][]Problem{} // PV name -> its problems
	for _, h := range health {
		pv, ok := byHandle[h.ID]
		if !ok {
			continue // no PV: an orphan, or one being made or deleted
		}
		for _, p := range h.Problems {
			if p.Reason != healthInactive {
				problems[pv.Name] = append(problems[pv.Name], p)
			}
		}
	}
	for _, x := range missing {
		byName[x.Name] = x.PV
		problems[x.Name] = append(problems[x.Name], Problem{Status: "INACCESSIBLE", Reason: healthMissing,
			Message: fmt.Sprintf("its LV is gone from the volume group since %s; its data is lost", x.Since.UTC().Format(time.RFC3339))})
	}

	now := map[string]abnormal{}
	counts := map[string]int{} // volume group -> abnormal volumes
	// Sorted, so a pass's Events are in a stable order.
	for _, name := range slices.Sorted(maps.Keys(problems)) {
		ps := problems[name]
		pv := byName[name]
		var reasons, msgs []string
		for _, p := range ps {
			reasons = append(reasons, p.Reason)
			msgs = append(msgs, p.Message)
		}
		slices.Sort(reasons)
		ab := abnormal{pv: pv, reasons: strings.Join(slices.Compact(reasons), ",")}
		now[name] = ab
		vg, _, _ := cut(pv.Handle)
		counts[vg]++
		if prev, ok := na.abnormal[name]; ok && prev.reasons == ab.reasons {
			continue
		}
		log.Info("Volume abnormal", "pv", name, "lv", pv.Handle, "claim", pv.Claim, "reasons", ab.reasons)
		a.cfg.Events.Eventf(healthRef(pv), corev1.EventTypeWarning, ReasonVolumeAbnormal,
			"volume %s (PersistentVolume %s) on node %s is abnormal (%s): %s. See carve's operations runbook: abnormal volumes",
			pv.Handle, pv.Name, na.node, ab.reasons, strings.Join(msgs, "; "))
	}
	for _, name := range slices.Sorted(maps.Keys(na.abnormal)) {
		prev := na.abnormal[name]
		if _, still := now[name]; still {
			continue
		}
		pv, exists := byName[name]
		if !exists || pv.Handle != prev.pv.Handle {
			continue // its PV is gone or going: nothing to tell
		}
		if vg, _, _ := cut(pv.Handle); !inv.readable(vg) {
			now[name] = prev // unknown this pass: judged again on the next
			counts[vg]++
			continue
		}
		log.Info("Volume recovered", "pv", name, "lv", pv.Handle, "claim", pv.Claim, "was", prev.reasons)
		a.cfg.Events.Eventf(healthRef(pv), corev1.EventTypeNormal, ReasonVolumeRecovered,
			"volume %s (PersistentVolume %s) on node %s is healthy again (it was abnormal: %s)", pv.Handle, pv.Name, na.node, prev.reasons)
	}
	na.abnormal = now
	a.m.publishAbnormal(na.node, inv.Classes, counts)
}

// healthRef is the claim, where its owner looks, or the PV when unbound.
func healthRef(pv PV) *corev1.ObjectReference {
	if ns, name, ok := cut(pv.Claim); ok {
		return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name, UID: types.UID(pv.ClaimUID), APIVersion: "v1"}
	}
	return &corev1.ObjectReference{Kind: "PersistentVolume", Name: pv.Name, APIVersion: "v1"}
}
