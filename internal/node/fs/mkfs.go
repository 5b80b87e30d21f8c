package fs

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// MkfsTypes are the filesystems carve makes.
var MkfsTypes = []string{"ext4", "xfs", "btrfs"}

// Makeable returns the MkfsTypes this host can make (btrfs only with
// mkfs.btrfs); stages mount all of them.
func Makeable(lookPath func(file string) (string, error)) []string {
	types := []string{"ext4", "xfs"}
	if _, err := lookPath("mkfs.btrfs"); err == nil {
		types = append(types, "btrfs")
	}
	return types
}

// OldestKernel is the oldest kernel the default mkfs options support.
const OldestKernel = "4.18"

// defaultMkfsOptions: what the image's tools make must mount read-write on
// OldestKernel, and discarding a whole large LV can outlast the kubelet's
// deadline for no gain:
//   - xfs: bigtime and inobtcount need Linux 5.10, nrext64 5.19;
//   - ext4: orphan_file needs 5.15 to mount read-write;
//   - btrfs: the 6.2 defaults (no-holes, free-space-tree) need 4.5.
var defaultMkfsOptions = map[string][]string{
	"xfs":   {"-K", "-m", "bigtime=0,inobtcount=0", "-i", "nrext64=0"},
	"ext4":  {"-E", "nodiscard", "-O", "^orphan_file"},
	"btrfs": {"-K"},
}

// DefaultMkfsOptions returns fsType's default mkfs options.
func DefaultMkfsOptions(fsType string) []string {
	return slices.Clone(defaultMkfsOptions[fsType])
}

type valueKind int

const (
	noValue  valueKind = iota // a flag alone (-K)
	subopts                   // key[=value],... with keys from an allow-list
	features                  // [^]feature,...
	number                    // digits, with an optional unit (4096, 64k)
	word                      // one lower-case word (a usage type)
)

type flagRule struct {
	kind valueKind
	keys []string // subopts: the allowed keys
}

// mkfsFlags are the flags carve passes to each mkfs; flags naming other
// files or devices, or labelling every volume alike, are left out.
var mkfsFlags = map[string]map[string]flagRule{
	"xfs": {
		"-K": {kind: noValue},
		"-m": {kind: subopts, keys: []string{"crc", "finobt", "rmapbt", "reflink", "bigtime", "inobtcount"}},
		"-i": {kind: subopts, keys: []string{"sparse", "nrext64", "size", "maxpct", "align", "attr", "projid32bit"}},
		"-b": {kind: subopts, keys: []string{"size"}},
		"-n": {kind: subopts, keys: []string{"size", "ftype"}},
		"-l": {kind: subopts, keys: []string{"size", "version", "su", "sunit", "lazy-count"}},
		"-d": {kind: subopts, keys: []string{"agcount", "agsize", "su", "sw", "sunit", "swidth"}},
		"-s": {kind: subopts, keys: []string{"size"}},
	},
	"ext4": {
		"-O": {kind: features},
		"-E": {kind: subopts, keys: []string{"nodiscard", "discard", "lazy_itable_init", "lazy_journal_init",
			"stride", "stripe_width", "stripe-width", "packed_meta_blocks", "num_backup_sb"}},
		"-J": {kind: subopts, keys: []string{"size", "fast_commit_size"}},
		"-b": {kind: number},
		"-i": {kind: number},
		"-I": {kind: number},
		"-N": {kind: number},
		"-g": {kind: number},
		"-G": {kind: number},
		"-T": {kind: word},
		"-j": {kind: noValue},
	},
	"btrfs": {
		"-K": {kind: noValue},
		"-O": {kind: features},
		"-R": {kind: features},
		"-n": {kind: number},
		"-s": {kind: number},
	},
}

var (
	featurePattern = regexp.MustCompile(`^\^?[a-z0-9_-]+$`)
	keyPattern     = regexp.MustCompile(`^[a-z0-9_-]+$`)
	valuePattern   = regexp.MustCompile(`^[A-Za-z0-9.]+$`)
	numberPattern  = regexp.MustCompile(`^[0-9]+[kKmMgG]?$`)
	wordPattern    = regexp.MustCompile(`^[a-z0-9]+$`)
)

// ValidateMkfsOptions checks options against mkfs.<fsType>'s allowed flags.
func ValidateMkfsOptions(fsType string, options []string) error {
	flags, ok := mkfsFlags[fsType]
	if !ok {
		return fmt.Errorf("filesystem %q: must be one of %s", fsType, strings.Join(MkfsTypes, ", "))
	}
	for i := 0; i < len(options); i++ {
		rule, ok := flags[options[i]]
		if !ok {
			return fmt.Errorf("[%d] %q: not an allowed flag of mkfs.%s; allowed: %s (each flag and its value are separate items)",
				i, options[i], fsType, strings.Join(sortedKeys(flags), " "))
		}
		if rule.kind == noValue {
			continue
		}
		if i+1 == len(options) {
			return fmt.Errorf("[%d] %q: needs a value as the next item", i, options[i])
		}
		i++
		if err := rule.check(options[i]); err != nil {
			return fmt.Errorf("[%d] %q (value of %s): %w", i, options[i], options[i-1], err)
		}
	}
	return nil
}

func (r flagRule) check(v string) error {
	switch r.kind {
	case number:
		if !numberPattern.MatchString(v) {
			return fmt.Errorf("must be a number, optionally followed by k, m or g")
		}
	case word:
		if !wordPattern.MatchString(v) {
			return fmt.Errorf("must be one word of lower-case letters and digits")
		}
	case features:
		for _, f := range strings.Split(v, ",") {
			if !featurePattern.MatchString(f) {
				return fmt.Errorf("feature %q: must be a name of lower-case letters, digits, _ and -, optionally preceded by ^", f)
			}
		}
	case subopts:
		for _, o := range strings.Split(v, ",") {
			k, val, hasVal := strings.Cut(o, "=")
			if !keyPattern.MatchString(k) || !slices.Contains(r.keys, k) {
				return fmt.Errorf("option %q: allowed: %s", k, strings.Join(r.keys, ", "))
			}
			if hasVal && !valuePattern.MatchString(val) {
				return fmt.Errorf("option %q: its value %q must be letters, digits and dots", k, val)
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]flagRule) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
