// Package lvmwatch tells when a VG's LVM metadata changes, whoever changes
// it: with backup/backup = 1 every change rewrites backup/<vg>, and inotify
// there notices changes made outside carve at once. Without backups the
// periodic refresh still catches them.
package lvmwatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// BackupDir is backup/ under LVM_SYSTEM_DIR (or /etc/lvm), unless lvm.conf
// says otherwise.
func BackupDir(getenv func(string) string) string {
	sys := getenv("LVM_SYSTEM_DIR")
	if sys == "" {
		sys = "/etc/lvm"
	}
	return filepath.Join(sys, "backup")
}

// Watch calls changed, one call at a time, each time one of vgs' backup
// files in dir is written or replaced, until ctx ends (then nil). It creates
// a missing dir as LVM would, and fails before any call if dir cannot be
// watched.
func Watch(ctx context.Context, dir string, vgs []string, changed func(vg string)) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("LVM backup directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			klog.FromContext(ctx).Error(err, "Closing the LVM backup watch failed")
		}
	}()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch LVM backup directory %s: %w", dir, err)
	}
	logger := klog.FromContext(ctx)
	logger.V(2).Info("Watching LVM metadata backups for changes made outside carve", "dir", dir, "volumeGroups", vgs)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			// LVM renames a temporary file to <vg>: a Create of <vg>.
			if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Write) {
				if vg := filepath.Base(ev.Name); slices.Contains(vgs, vg) {
					logger.V(4).Info("LVM metadata of a volume group changed", "volumeGroup", vg, "event", ev.Op.String())
					changed(vg)
				}
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: treat it as a change of every group.
			logger.Error(err, "LVM backup watch error; refreshing anyway")
			for _, vg := range vgs {
				changed(vg)
			}
		}
	}
}
