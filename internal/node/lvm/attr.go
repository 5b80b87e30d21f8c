package lvm

// lv_attr (lvs(8)), one state per character:
//
//	1 volume type   2 permissions   3 allocation policy   4 fixed minor
//	5 state         6 device open   7 target type         8 zero new blocks
//	9 health        10 skip activation
//
// Older releases print fewer; missing ones decode as unset.

var volumeTypes = map[byte]VolumeType{
	'-': TypeThick, // linear or striped
	'm': TypeThick, // mirrored
	'M': TypeThick, // mirrored without initial sync
	'r': TypeThick, // raid
	'R': TypeThick, // raid without initial sync
	'o': TypeThick, // origin of an old-style snapshot
	'O': TypeThick, // origin with a merging snapshot
	'c': TypeThick, // under conversion
	'V': TypeThin,
	't': TypeThinPool,
	's': TypeSnapshot,
	'S': TypeSnapshot, // merging snapshot
	'i': TypeInternal, // mirror or raid image
	'I': TypeInternal, // image out of sync
	'l': TypeInternal, // mirror log
	'T': TypeInternal, // thin pool data
	'e': TypeInternal, // raid or pool metadata, pool metadata spare
	'p': TypeInternal, // pvmove
	'g': TypeInternal, // integrity metadata
	'D': TypeInternal, // vdo pool data
}

var healths = map[byte]Health{
	'-': HealthOK,
	'p': HealthPartial,
	'r': HealthRefreshNeeded,
	'm': HealthMismatchesExist,
	'w': HealthWriteMostly,
	's': HealthReshaping,
	'R': HealthReshaping, // remove after reshape
	'F': HealthFailed,
	'E': HealthFailed, // dm-writecache reports an error
	'D': HealthOutOfData,
	'M': HealthMetadataReadOnly,
	'X': HealthUnknown,
}

// ParseAttributes decodes lv_attr. Unknown characters decode as TypeOther /
// HealthUnknown: a newer LVM must not make the report unreadable.
func ParseAttributes(attr string) Attributes {
	a := Attributes{Raw: attr, Type: TypeOther, Health: HealthOK}
	at := func(i int) byte {
		if i < len(attr) {
			return attr[i]
		}
		return 0
	}
	if t, ok := volumeTypes[at(0)]; ok {
		a.Type = t
	}
	switch at(4) {
	case 'a', 's': // active, or active but suspended
		a.Active = true
	}
	a.Open = at(5) == 'o'
	a.SnapshotInvalid = a.Type == TypeSnapshot && (at(4) == 'I' || at(4) == 'S')
	if c := at(8); c != 0 {
		if h, ok := healths[c]; ok {
			a.Health = h
		} else {
			a.Health = HealthUnknown
		}
	}
	a.ActivationSkip = at(9) == 'k'
	a.ZeroNewBlocks = at(7) == 'z'
	return a
}
