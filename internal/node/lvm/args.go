package lvm

import "strconv"

// Command lines of the mutations. Every name is validated, so none can be
// taken for an option. Sizes are bytes ("<n>b") already rounded to extents,
// so LVM does no rounding the result would not show.

func bytesArg(n uint64) string { return strconv.FormatUint(n, 10) + "b" }

func addTags(args, tags []string) []string {
	for _, t := range tags {
		args = append(args, "--addtag", t)
	}
	return args
}

// createArgs builds lvcreate. Thick LVs get --wipesignatures y --zero y:
// their extents may have held a removed LV, and NodeStage formats only a
// device without a signature, so an old one would mount the previous
// tenant's filesystem. Where activation is disabled LVM warns "not zeroed":
// no device node exists to be read. Thin LVs read zeros and need neither.
func createArgs(req CreateRequest, size uint64) []string {
	args := []string{"lvcreate", "--yes"}
	if req.ThinPool != "" {
		args = append(args, "--type", "thin", "--name", req.Name, "--virtualsize", bytesArg(size),
			"--thinpool", req.ThinPool)
		return append(addTags(args, req.Tags), req.VolumeGroup)
	}
	args = append(args, "--wipesignatures", "y", "--zero", "y", "--name", req.Name, "--size", bytesArg(size))
	args = addTags(args, req.Tags)
	o := req.Options
	switch {
	case o.Mirrors > 0:
		args = append(args, "--type", "raid1", "--mirrors", strconv.Itoa(o.Mirrors))
	case o.Stripes > 1:
		args = append(args, "--stripes", strconv.Itoa(o.Stripes))
		if o.StripeSize > 0 {
			args = append(args, "--stripesize", bytesArg(o.StripeSize))
		}
	}
	return append(args, req.VolumeGroup)
}

// snapshotArgs builds lvcreate for a copy-on-write snapshot, or a thin one
// when size is zero. activation-skip is set as asked, never left to lvm.conf.
func snapshotArgs(req SnapshotRequest, size uint64) []string {
	args := []string{"lvcreate", "--yes", "--snapshot"}
	if size > 0 {
		args = append(args, "--size", bytesArg(size))
	} else {
		skip := "n"
		if req.ActivationSkip {
			skip = "y"
		}
		args = append(args, "--setactivationskip", skip)
	}
	args = append(args, "--name", req.Name)
	return append(addTags(args, req.Tags), req.VolumeGroup+"/"+req.Origin)
}

func extendArgs(vg, name string, size uint64) []string {
	return []string{"lvextend", "--size", bytesArg(size), vg + "/" + name}
}

// activateArgs builds lvchange --activate y. It succeeds yet leaves an LV
// with the activation-skip flag inactive, so --ignoreactivationskip is added
// for such an LV only.
func activateArgs(vg, name string, skip bool) []string {
	args := []string{"lvchange", "--activate", "y"}
	if skip {
		args = append(args, "--ignoreactivationskip")
	}
	return append(args, vg+"/"+name)
}

// deactivateArgs builds lvchange --activate n; a thin pool stays active.
func deactivateArgs(vg, name string) []string {
	return []string{"lvchange", "--activate", "n", vg + "/" + name}
}

func delTagsArgs(vg, name string, tags []string) []string {
	args := []string{"lvchange"}
	for _, t := range tags {
		args = append(args, "--deltag", t)
	}
	return append(args, vg+"/"+name)
}

func changeTagsArgs(vg, name string, add, del []string) []string {
	args := []string{"lvchange"}
	for _, t := range del {
		args = append(args, "--deltag", t)
	}
	args = addTags(args, add)
	return append(args, vg+"/"+name)
}

func renameArgs(vg, name, newName string) []string {
	return []string{"lvrename", vg, name, newName}
}

// removeArgs builds lvremove; --yes answers the prompt for an active LV.
func removeArgs(vg, name string) []string {
	return []string{"lvremove", "--yes", vg + "/" + name}
}

// roundToExtents rounds up to extents (per stripe) as LVM does; 0 is one.
func roundToExtents(size, extent uint64, stripes int) uint64 {
	n := (size + extent - 1) / extent
	if n == 0 {
		n = 1
	}
	if stripes > 1 {
		s := uint64(stripes)
		n = (n + s - 1) / s * s
	}
	return n * extent
}

// extentsNeeded: raid1 takes a copy and a metadata extent per image.
func extentsNeeded(n uint64, o LVOptions) uint64 {
	if o.Mirrors > 0 {
		return uint64(o.Mirrors+1) * (n + 1)
	}
	return n
}
