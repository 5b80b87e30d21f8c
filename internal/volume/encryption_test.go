package volume

import (
	"strings"
	"testing"
)

func TestParseEncryption(t *testing.T) {
	for _, c := range []struct {
		params  map[string]string
		want    bool
		wantErr bool
	}{
		{nil, false, false},
		{map[string]string{ParamEncryption: "none"}, false, false},
		{map[string]string{ParamEncryption: "luks2"}, true, false},
		{map[string]string{ParamEncryption: "LUKS2"}, false, true},
		{map[string]string{ParamEncryption: ""}, false, true},
		{map[string]string{ParamEncryption: "luks1"}, false, true},
	} {
		got, err := ParseEncryption(c.params)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("ParseEncryption(%v) = %v, %v", c.params, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), ParamEncryption) {
			t.Errorf("error %q does not name the parameter", err)
		}
	}
}

func TestMapperName(t *testing.T) {
	if got := MapperName("carve-0123456789abcdef0123456789abcdef"); got != "carve-luks-0123456789abcdef0123456789abcdef" {
		t.Errorf("MapperName = %q", got)
	}
}
