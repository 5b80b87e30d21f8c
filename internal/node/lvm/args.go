package lvm

import "strconv"

// Command lines of the mutations. Every name in them has been validated, so
// none begins with '-' and none can be taken for an option. Sizes are passed
// in bytes ("<n>b") already rounded to whole extents, so LVM does no
// rounding of its own that the result would not show.

func bytesArg(n uint64) string { return strconv.FormatUint(n, 10) + "b" }

func addTags(args, tags []string) []string {
	for _, t := range tags {
		args = append(args, "--addtag", t)
	}
	return args
}

// createArgs builds lvcreate for a thick or a thin LV of size bytes. Thick
// LVs get --wipesignatures y --zero y (--yes answers the prompt): their
// extents may have held a removed LV, and NodeStage formats only a device on
// which blkid finds no filesystem, so an old signature would have carve mount
// the previous tenant's filesystem. Where activation is disabled (the host
// tier) LVM warns "not zeroed": no device node exists to be read. Thin LVs
// read zeros where never written and need neither.
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

// snapshotArgs builds lvcreate for a snapshot of size bytes of
// copy-on-write space (already rounded), or a thin snapshot when size is
// zero. A thin snapshot's activation-skip flag is set as asked, never left
// to lvm.conf: a snapshot kept as a snapshot stays inactive until needed,
// one used as a volume must come up after a reboot.
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

// extendArgs builds lvextend to size bytes. The filesystem is not touched:
// the node grows it after the device.
func extendArgs(vg, name string, size uint64) []string {
	return []string{"lvextend", "--size", bytesArg(size), vg + "/" + name}
}

// activateArgs builds lvchange to activate one LV (a thin LV's pool with it).
// A plain `lvchange --activate y` succeeds yet leaves an LV with the
// activation-skip flag inactive, so --ignoreactivationskip is added for such
// an LV, and only for it.
func activateArgs(vg, name string, skip bool) []string {
	args := []string{"lvchange", "--activate", "y"}
	if skip {
		args = append(args, "--ignoreactivationskip")
	}
	return append(args, vg+"/"+name)
}

// deactivateArgs builds lvchange to deactivate one LV (a thin LV's pool
// stays active).
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

// changeTagsArgs builds one lvchange that takes tags off and puts tags on
// (one metadata commit).
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

// removeArgs builds lvremove; --yes answers the prompt LVM shows for an
// active LV.
func removeArgs(vg, name string) []string {
	return []string{"lvremove", "--yes", vg + "/" + name}
}

// roundToExtents rounds size up to whole extents, and to a multiple of the
// stripe count for striped LVs, as LVM does. Zero becomes one extent (the
// smallest LV there is).
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

// extentsNeeded is how many free extents an LV of n extents takes from the
// VG: raid1 keeps a full copy per image plus one metadata extent each.
func extentsNeeded(n uint64, o LVOptions) uint64 {
	if o.Mirrors > 0 {
		return uint64(o.Mirrors+1) * (n + 1)
	}
	return n
}
