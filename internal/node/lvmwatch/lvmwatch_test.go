package lvmwatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestBackupDir(t *testing.T) {
	for _, tc := range []struct {
		name, sysDir, want string
	}{
		{name: "LVM's default", want: "/etc/lvm/backup"},
		{name: "LVM_SYSTEM_DIR", sysDir: "/run/lvmtest", want: "/run/lvmtest/backup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := BackupDir(func(k string) string {
				if k == "LVM_SYSTEM_DIR" {
					return tc.sysDir
				}
				return ""
			})
			if got != tc.want {
				t.Errorf("BackupDir = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestWatchSeesOnlyTheConfiguredGroups writes backups the way LVM does (a
// temporary file renamed to <vg>) and in place, for a configured group and
// for another one; only the configured group's count as changes.
func TestWatchSeesOnlyTheConfiguredGroups(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, dir, vg string)
	}{
		{"renamed into place", func(t *testing.T, dir, vg string) {
			tmp := filepath.Join(dir, ".lvm_host_1_"+vg)
			if err := os.WriteFile(tmp, []byte("contents"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, vg)); err != nil {
				t.Fatal(err)
			}
		}},
		{"written in place", func(t *testing.T, dir, vg string) {
			if err := os.WriteFile(filepath.Join(dir, vg), []byte("contents"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "backup") // missing: Watch makes it
			ctx, cancel := context.WithCancel(context.Background())
			seen := make(chan string, 1024)
			done := make(chan error, 1)
			go func() {
				done <- Watch(ctx, dir, []string{"vg0"}, func(vg string) { seen <- vg })
			}()
			// The first writes may predate the watch, so repeat them
			// until vg0's is seen; each round writes "other" first, and
			// events are handled in order.
			waitDir(t, dir)
			deadline := time.After(30 * time.Second)
		wait:
			for {
				tc.write(t, dir, "other")
				tc.write(t, dir, "vg0")
				select {
				case vg := <-seen:
					if vg != "vg0" {
						t.Fatalf("changed(%q); only vg0 is watched", vg)
					}
					break wait
				case <-time.After(100 * time.Millisecond):
				case <-deadline:
					t.Fatal("no change reported for vg0's backup within 30 s")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Watch: %v", err)
			}
			close(seen)
			for vg := range seen {
				if vg != "vg0" {
					t.Errorf("changed(%q); only vg0 is watched", vg)
				}
			}
		})
	}
}

func waitDir(t *testing.T, dir string) {
	t.Helper()
	for range 300 {
		if _, err := os.Stat(dir); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("Watch did not make %s", dir)
}
