package lvm

import "testing"

func TestParseAttributes(t *testing.T) {
	// Each row is an lv_attr string as lvm2 prints it. The first group was
	// recorded on the host tier (activation disabled, so state and open are
	// X); the rest are the states lvs(8) documents for the volume kinds
	// carve meets (thin pools and their hidden LVs, thin LVs and snapshots,
	// raid1 and its images, old-style snapshots).
	tests := []struct {
		attr string
		want Attributes
	}{
		{"-wi-XX----", Attributes{Type: TypeThick, Health: HealthOK}},
		{"-wi-XX--p-", Attributes{Type: TypeThick, Health: HealthPartial}},
		{"-wi-a-----", Attributes{Type: TypeThick, Active: true, Health: HealthOK}},
		{"-wi-ao----", Attributes{Type: TypeThick, Active: true, Open: true, Health: HealthOK}},
		{"-wi-------", Attributes{Type: TypeThick, Health: HealthOK}},
		{"-wi-s-----", Attributes{Type: TypeThick, Active: true, Health: HealthOK}},
		{"-wi-d-----", Attributes{Type: TypeThick, Health: HealthOK}},
		{"-wi-a---p-", Attributes{Type: TypeThick, Active: true, Health: HealthPartial}},
		{"twi-aotz--", Attributes{Type: TypeThinPool, Active: true, Open: true, Health: HealthOK, ZeroNewBlocks: true}},
		{"twi-aotzD-", Attributes{Type: TypeThinPool, Active: true, Open: true, Health: HealthOutOfData, ZeroNewBlocks: true}},
		{"twi-aotzM-", Attributes{Type: TypeThinPool, Active: true, Open: true, Health: HealthMetadataReadOnly, ZeroNewBlocks: true}},
		// A pool made with --zero n (or thin_pool_zero = 0).
		{"twi-aot---", Attributes{Type: TypeThinPool, Active: true, Open: true, Health: HealthOK}},
		{"twi---tz--", Attributes{Type: TypeThinPool, Health: HealthOK, ZeroNewBlocks: true}},
		{"Twi-ao----", Attributes{Type: TypeInternal, Active: true, Open: true, Health: HealthOK}},
		{"ewi-ao----", Attributes{Type: TypeInternal, Active: true, Open: true, Health: HealthOK}},
		{"ewi-------", Attributes{Type: TypeInternal, Health: HealthOK}},
		{"Vwi-a-tz--", Attributes{Type: TypeThin, Active: true, Health: HealthOK, ZeroNewBlocks: true}},
		{"Vwi-aotz--", Attributes{Type: TypeThin, Active: true, Open: true, Health: HealthOK, ZeroNewBlocks: true}},
		{"Vwi---tz-k", Attributes{Type: TypeThin, Health: HealthOK, ActivationSkip: true, ZeroNewBlocks: true}},
		{"Vwi-a-tz-k", Attributes{Type: TypeThin, Active: true, Health: HealthOK, ActivationSkip: true, ZeroNewBlocks: true}},
		{"rwi-a-r---", Attributes{Type: TypeThick, Active: true, Health: HealthOK}},
		{"rwi-a-r-p-", Attributes{Type: TypeThick, Active: true, Health: HealthPartial}},
		{"rwi-a-r-r-", Attributes{Type: TypeThick, Active: true, Health: HealthRefreshNeeded}},
		{"rwi-a-r-m-", Attributes{Type: TypeThick, Active: true, Health: HealthMismatchesExist}},
		{"Rwi-a-r---", Attributes{Type: TypeThick, Active: true, Health: HealthOK}},
		{"iwi-aor---", Attributes{Type: TypeInternal, Active: true, Open: true, Health: HealthOK}},
		{"Iwi-aor---", Attributes{Type: TypeInternal, Active: true, Open: true, Health: HealthOK}},
		{"iwi-aor-w-", Attributes{Type: TypeInternal, Active: true, Open: true, Health: HealthWriteMostly}},
		{"rwi-a-r-F-", Attributes{Type: TypeThick, Active: true, Health: HealthFailed}},
		{"owi-aos---", Attributes{Type: TypeThick, Active: true, Open: true, Health: HealthOK}},
		{"swi-a-s---", Attributes{Type: TypeSnapshot, Active: true, Health: HealthOK}},
		{"swi-I-s---", Attributes{Type: TypeSnapshot, Health: HealthOK, SnapshotInvalid: true}}, // copy-on-write space ran out
		{"swi-a-s---", Attributes{Type: TypeSnapshot, Active: true, Health: HealthOK}},
		{"vwi-a-v---", Attributes{Type: TypeOther, Active: true, Health: HealthOK}},
		{"Cwi-a-C---", Attributes{Type: TypeOther, Active: true, Health: HealthOK}},
		{"-wi-a---X-", Attributes{Type: TypeThick, Active: true, Health: HealthUnknown}},
		{"-wi-a---?-", Attributes{Type: TypeThick, Active: true, Health: HealthUnknown}},
		// Older releases print eight characters: no health column.
		{"-wi-a---", Attributes{Type: TypeThick, Active: true, Health: HealthOK}},
		{"", Attributes{Type: TypeOther, Health: HealthOK}},
	}
	for _, tt := range tests {
		t.Run(tt.attr, func(t *testing.T) {
			tt.want.Raw = tt.attr
			if got := ParseAttributes(tt.attr); got != tt.want {
				t.Errorf("ParseAttributes(%q) = %+v, want %+v", tt.attr, got, tt.want)
			}
		})
	}
}
