package volume

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// IO limit parameters of StorageClasses and VolumeAttributesClasses, applied to the
// io.max of every pod the volume is published to.
const (
	// ParamReadBytesPerSecond bounds bytes read per second.
	ParamReadBytesPerSecond = "carve.dev/read-bytes-per-second"
	// ParamWriteBytesPerSecond bounds the bytes per second written.
	ParamWriteBytesPerSecond = "carve.dev/write-bytes-per-second"
	// ParamReadIOPS bounds the read operations per second.
	ParamReadIOPS = "carve.dev/read-iops"
	// ParamWriteIOPS bounds the write operations per second.
	ParamWriteIOPS = "carve.dev/write-iops"
)

// IOLimitUnlimited lifts a limit, as io.max spells it.
const IOLimitUnlimited = "max"

// io.max takes 64-bit byte rates and 32-bit operation rates.
const (
	MaxBytesPerSecond = uint64(1) << 62
	MaxIOPS           = uint64(1)<<32 - 2
)

// IOLimits are a volume's IO limits; 0 is no limit.
type IOLimits struct {
	ReadBPS, WriteBPS, ReadIOPS, WriteIOPS uint64
}

// Any tells whether some limit is set.
func (l IOLimits) Any() bool { return l != IOLimits{} }

// String is the limits as io.max names them, "max" where none is set.
func (l IOLimits) String() string {
	v := func(n uint64) string {
		if n == 0 {
			return IOLimitUnlimited
		}
		return strconv.FormatUint(n, 10)
	}
	return fmt.Sprintf("rbps=%s wbps=%s riops=%s wiops=%s", v(l.ReadBPS), v(l.WriteBPS), v(l.ReadIOPS), v(l.WriteIOPS))
}

type ioLimit struct {
	param, tag string
	bytes      bool
	field      func(*IOLimits) *uint64
}

var ioLimitKinds = []ioLimit{
	{ParamReadBytesPerSecond, "carve.dev/rbps=", true, func(l *IOLimits) *uint64 { return &l.ReadBPS }},
	{ParamWriteBytesPerSecond, "carve.dev/wbps=", true, func(l *IOLimits) *uint64 { return &l.WriteBPS }},
	{ParamReadIOPS, "carve.dev/riops=", false, func(l *IOLimits) *uint64 { return &l.ReadIOPS }},
	{ParamWriteIOPS, "carve.dev/wiops=", false, func(l *IOLimits) *uint64 { return &l.WriteIOPS }},
}

// IOLimitParams lists the IO limit parameters, sorted.
func IOLimitParams() []string {
	out := make([]string, 0, len(ioLimitKinds))
	for _, k := range ioLimitKinds {
		out = append(out, k.param)
	}
	slices.Sort(out)
	return out
}

// IsIOLimitParam tells whether key is one of the IO limit parameters.
func IsIOLimitParam(key string) bool {
	return slices.ContainsFunc(ioLimitKinds, func(k ioLimit) bool { return k.param == key })
}

// IOLimitError is a parameter value that is not a limit.
type IOLimitError struct {
	Param, Value string
}

func (e *IOLimitError) Error() string {
	allowed := "a whole number from 1 to " + strconv.FormatUint(MaxIOPS, 10)
	for _, k := range ioLimitKinds {
		if k.param == e.Param && k.bytes {
			allowed = "bytes per second from 1 to 2^62 as a whole number or a quantity (500Ki, 20Mi, 1G)"
		}
	}
	if !IsIOLimitParam(e.Param) {
		return fmt.Sprintf("%s: not a mutable parameter of carve; allowed: %s", e.Param, strings.Join(IOLimitParams(), ", "))
	}
	return fmt.Sprintf("%s: %q is not a limit; allowed: %s, or %q for none", e.Param, e.Value, allowed, IOLimitUnlimited)
}

// ParseIOLimits reads the limit parameters over base ("max" lifts one). Other keys
// are ignored when others is true, else refused. The error is an *IOLimitError.
func ParseIOLimits(params map[string]string, base IOLimits, others bool) (IOLimits, error) {
	out := base
	for _, key := range slices.Sorted(maps.Keys(params)) {
		value := params[key]
		i := slices.IndexFunc(ioLimitKinds, func(k ioLimit) bool { return k.param == key })
		if i < 0 {
			if others {
				continue
			}
			return base, &IOLimitError{Param: key, Value: value}
		}
		n, ok := parseIOLimit(value, ioLimitKinds[i].bytes)
		if !ok {
			return base, &IOLimitError{Param: key, Value: value}
		}
		*ioLimitKinds[i].field(&out) = n
	}
	return out, nil
}

func parseIOLimit(s string, bytes bool) (uint64, bool) {
	if s == IOLimitUnlimited {
		return 0, true
	}
	if !bytes {
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil && n >= 1 && n <= MaxIOPS
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return 0, false
	}
	n, exact := q.AsInt64()
	if !exact || n < 1 || uint64(n) > MaxBytesPerSecond {
		return 0, false
	}
	return uint64(n), true
}

// IOLimitTags record l on the LV, so the node finds the limits after a restart.
func IOLimitTags(l IOLimits) []string {
	var tags []string
	for _, k := range ioLimitKinds {
		if n := *k.field(&l); n != 0 {
			tags = append(tags, k.tag+strconv.FormatUint(n, 10))
		}
	}
	return tags
}

// IsIOLimitTag tells whether tag is one of IOLimitTags'.
func IsIOLimitTag(tag string) bool {
	return slices.ContainsFunc(ioLimitKinds, func(k ioLimit) bool { return strings.HasPrefix(tag, k.tag) })
}

// IOLimitsFromTags reads IOLimitTags; a bad value is no limit.
func IOLimitsFromTags(tags []string) IOLimits {
	var l IOLimits
	for _, t := range tags {
		for _, k := range ioLimitKinds {
			v, ok := strings.CutPrefix(t, k.tag)
			if !ok {
				continue
			}
			top := MaxIOPS
			if k.bytes {
				top = MaxBytesPerSecond
			}
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n >= 1 && n <= top {
				*k.field(&l) = n
			}
		}
	}
	return l
}
