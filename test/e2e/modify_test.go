//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/internal/volume"
)

// TestModifyVolumeThroughTheResizer: the shipped controller Deployment's
// csi-resizer takes a claim's new VolumeAttributesClass to carve
// controller (ControllerModifyVolume), which sends it to the volume's
// node: the claim's status names the class, and the LV carries the
// limit. A class with a parameter carve does not know is refused: the
// claim reports the modify Infeasible with an Event naming the
// parameter, keeps its class, and the LV its limit. (Simulated nodes run
// no pods; the real-node tier measures limits inside pods.)
func TestModifyVolumeThroughTheResizer(t *testing.T) {
	ns := newNamespace(t, "modify")
	ctx := testCtx(t, 4*time.Minute)
	slow, bogus := ns+"-4mib", ns+"-bogus"
	for name, params := range map[string]map[string]string{
		slow:  {volume.ParamWriteBytesPerSecond: "4Mi", volume.ParamReadIOPS: "100"},
		bogus: {"carve.dev/write-speed": "fast"},
	} {
		vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: "lvm.carve.dev", Parameters: params}
		if _, err := bed.Client.StorageV1().VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := bed.Client.StorageV1().VolumeAttributesClasses().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	pvName := waitBound(t, ns, "data", settle).Spec.VolumeName

	patch := func(class string) {
		t.Helper()
		body := fmt.Sprintf(`{"spec":{"volumeAttributesClassName":%q}}`, class)
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(ctx context.Context) (current, modify string, _ error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return "", "", err
		}
		if c.Status.CurrentVolumeAttributesClassName != nil {
			current = *c.Status.CurrentVolumeAttributesClassName
		}
		if m := c.Status.ModifyVolumeStatus; m != nil {
			modify = string(m.Status) + " " + m.TargetVolumeAttributesClassName
		}
		return current, modify, nil
	}
	wantLimits := func(what string) {
		t.Helper()
		_, lv, err := lvOfPV(ctx, pvName)
		if err != nil || lv == nil {
			t.Fatalf("the LV of %s: %v", pvName, err)
		}
		want := []string{"carve.dev/riops=100", "carve.dev/wbps=4194304"}
		got := slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return !volume.IsIOLimitTag(t) })
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the LV's limit tags are %v, want %v", what, got, want)
		}
	}

	patch(slow)
	waitFor(t, settle, "the claim's current class "+slow, func(ctx context.Context) (bool, string, error) {
		cur, mod, err := status(ctx)
		return cur == slow, fmt.Sprintf("current %q, modify %q", cur, mod), err
	})
	wantLimits("after " + slow)

	patch(bogus)
	waitFor(t, settle, "the modify to "+bogus+" Infeasible, with an Event naming the parameter", func(ctx context.Context) (bool, string, error) {
		cur, mod, err := status(ctx)
		if err != nil {
			return false, "", err
		}
		evs, err := events(ctx, ns, "PersistentVolumeClaim", "data")
		if err != nil {
			return false, "", err
		}
		named := slices.ContainsFunc(evs, func(e corev1.Event) bool {
			return e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "carve.dev/write-speed") && strings.Contains(e.Message, "not a mutable parameter")
		})
		return cur == slow && mod == string(corev1.PersistentVolumeClaimModifyVolumeInfeasible)+" "+bogus && named,
			fmt.Sprintf("current %q, modify %q, an Event names the parameter: %v", cur, mod, named), nil
	})
	wantLimits("after the refused " + bogus)
}
