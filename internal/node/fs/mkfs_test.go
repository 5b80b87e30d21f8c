package fs

import (
	"errors"
	"slices"
	"testing"
)

func TestMakeable(t *testing.T) {
	tests := []struct {
		name  string
		found []string
		want  []string
	}{
		{name: "no btrfs tools", found: []string{"mkfs.ext4", "mkfs.xfs"}, want: []string{"ext4", "xfs"}},
		{name: "btrfs tools", found: []string{"mkfs.ext4", "mkfs.xfs", "mkfs.btrfs"}, want: []string{"ext4", "xfs", "btrfs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookPath := func(file string) (string, error) {
				if slices.Contains(tt.found, file) {
					return "/sbin/" + file, nil
				}
				return "", errors.New("not found")
			}
			if got := Makeable(lookPath); !slices.Equal(got, tt.want) {
				t.Errorf("Makeable = %v, want %v", got, tt.want)
			}
		})
	}
}
