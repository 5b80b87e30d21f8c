package plugintest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// ownerTag is internal/node/driver's TagOwner, spelled out: these tests look at LVM
// from the outside, as an operator would.
const ownerTag = "carve.dev/owner=carve"

// CommandTimeout bounds every command run through Run: lvm and mkfs in the
// TCG guest take seconds, never minutes.
const CommandTimeout = 2 * time.Minute

// Run runs argv (no shell) with LC_ALL=C and DM_DISABLE_UDEV=1 (no udev in
// the guest: LVM makes its device nodes itself) and returns its stdout. A
// failure carries the command line and its stderr.
func Run(ctx context.Context, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DM_DISABLE_UDEV=1", "LVM_SUPPRESS_FD_WARNINGS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// LoopbackUp brings up the guest's loopback interface (the guest's init
// leaves it down when no network was asked for): the plugin serves its
// metrics on 127.0.0.1.
func LoopbackUp(ctx context.Context) error {
	_, err := Run(ctx, "ip", "link", "set", "dev", "lo", "up")
	return err
}

// VGState is a volume group's size and free space as `vgs` reports them.
type VGState struct {
	Size, Free uint64
}

// ReadVG runs one `vgs --reportformat json --units b --nosuffix` for vg.
func ReadVG(ctx context.Context, vg *lvmtest.LoopVG) (VGState, error) {
	out, err := vg.LVM(ctx, "vgs", "--reportformat", "json", "--units", "b", "--nosuffix",
		"-o", "vg_name,vg_size,vg_free", vg.Name)
	if err != nil {
		return VGState{}, err
	}
	var rep struct {
		Report []struct {
			VG []struct {
				Name string `json:"vg_name"`
				Size string `json:"vg_size"`
				Free string `json:"vg_free"`
			} `json:"vg"`
		} `json:"report"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return VGState{}, fmt.Errorf("parsing vgs output %q: %w", out, err)
	}
	if len(rep.Report) != 1 || len(rep.Report[0].VG) != 1 {
		return VGState{}, fmt.Errorf("vgs reported no single volume group %s: %q", vg.Name, out)
	}
	v := rep.Report[0].VG[0]
	size, err1 := strconv.ParseUint(v.Size, 10, 64)
	free, err2 := strconv.ParseUint(v.Free, 10, 64)
	if err1 != nil || err2 != nil {
		return VGState{}, fmt.Errorf("vgs printed sizes %q and %q", v.Size, v.Free)
	}
	return VGState{Size: size, Free: free}, nil
}

// CarveLVs lists the LVs of vg that carry carve's owner tag.
func CarveLVs(ctx context.Context, vg *lvmtest.LoopVG) ([]string, error) {
	out, err := vg.LVM(ctx, "lvs", "--reportformat", "json", "-o", "lv_name,lv_tags", vg.Name)
	if err != nil {
		return nil, err
	}
	var rep struct {
		Report []struct {
			LV []struct {
				Name string `json:"lv_name"`
				Tags string `json:"lv_tags"`
			} `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, fmt.Errorf("parsing lvs output %q: %w", out, err)
	}
	var names []string
	for _, r := range rep.Report {
		for _, lv := range r.LV {
			for _, tag := range strings.Split(lv.Tags, ",") {
				if tag == ownerTag {
					names = append(names, lv.Name)
				}
			}
		}
	}
	return names, nil
}

// IsMountPoint tells whether path is a mount point, from
// /proc/self/mountinfo (path must be clean and absolute; mount points with
// spaces are not expected in these tests).
func IsMountPoint(path string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && fields[4] == path {
			return true, nil
		}
	}
	return false, nil
}

// FilesystemUUID returns the UUID blkid reads from device's superblock
// (bypassing blkid's cache, which would hide a new filesystem).
func FilesystemUUID(ctx context.Context, device string) (string, error) {
	out, err := Run(ctx, "blkid", "--probe", "--output", "value", "--match-tag", "UUID", device)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// ThinPoolOf returns the thin pool of LV lv in vg ("" for a thick LV).
func ThinPoolOf(ctx context.Context, vg *lvmtest.LoopVG, lv string) (string, error) {
	out, err := vg.LVM(ctx, "lvs", "--reportformat", "json", "-o", "lv_name,pool_lv", vg.Name+"/"+lv)
	if err != nil {
		return "", err
	}
	var rep struct {
		Report []struct {
			LV []struct {
				Name string `json:"lv_name"`
				Pool string `json:"pool_lv"`
			} `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return "", fmt.Errorf("parsing lvs output %q: %w", out, err)
	}
	if len(rep.Report) != 1 || len(rep.Report[0].LV) != 1 {
		return "", fmt.Errorf("lvs reported no single LV %s/%s: %q", vg.Name, lv, out)
	}
	return rep.Report[0].LV[0].Pool, nil
}
