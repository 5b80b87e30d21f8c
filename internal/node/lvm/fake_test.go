package lvm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fakeLVM answers lvm command lines from a state loaded from a recorded
// report: it is a function of argv (what the command asks), not a script of
// calls in an expected order. Reads (fullreport, vgs, lvs) are answered from
// the state in LVM's JSON shape; mutations go to the mutate hook, which
// answers success by default and may change the state.
type fakeLVM struct {
	mu  sync.Mutex
	vgs []jsonVG
	// pvs are the PVs of each VG, by its name.
	pvs   map[string][]jsonPV
	lvs   []jsonLV
	calls [][]string
	// mutate answers lvcreate, lvextend, lvremove and lvchange; when it is
	// nil, lvchange --activate y activates as LVM does (see activate) and
	// the others succeed without changing the state.
	mutate func(args []string) output
	// activationFilter, when set, makes lvchange succeed without activating
	// anything, as an lvm.conf activation/volume_list that excludes the LV.
	activationFilter bool
	// readErr, when set, answers every read with this exit code.
	readErr *output
}

func loadFake(t *testing.T, fixture string) *fakeLVM {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := decodeReport(b)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLVM{pvs: map[string][]jsonPV{}}
	for _, sub := range raw.Report {
		f.vgs = append(f.vgs, sub.VG...)
		for _, vg := range sub.VG {
			f.pvs[vg.Name] = sub.PV
		}
		f.lvs = append(f.lvs, sub.LV...)
	}
	return f
}

// client returns a Client whose commands this fake answers.
func (f *fakeLVM) client() *Client {
	return newClient(Options{}, runnerFunc(f.run), nil)
}

func (f *fakeLVM) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for _, c := range f.calls {
		names = append(names, c[0])
	}
	return names
}

func (f *fakeLVM) resetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// setAttr changes the lv_attr of vg/lv in the state.
func (f *fakeLVM) setAttr(vg, lv, attr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.lvs {
		if f.lvs[i].VG == vg && f.lvs[i].Name == lv {
			f.lvs[i].Attr = attr
		}
	}
}

func (f *fakeLVM) run(ctx context.Context, args []string) (output, error) {
	f.mu.Lock()
	f.calls = append(f.calls, slices.Clone(args))
	mutate, readErr := f.mutate, f.readErr
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return output{ExitCode: -1}, err
	}
	switch args[0] {
	case "lvcreate", "lvextend", "lvremove", "lvchange", "lvrename":
		if mutate != nil {
			return mutate(args), nil
		}
		if args[0] == "lvchange" {
			return f.activate(args), nil
		}
		return output{}, nil
	}
	if readErr != nil {
		return *readErr, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch args[0] {
	case "fullreport":
		return f.fullreport(args), nil
	case "vgs":
		return f.vgsReport(args), nil
	case "lvs":
		return f.lvsReport(args), nil
	}
	return output{ExitCode: exitNoSuchCommand, Stderr: []byte("no such command " + args[0])}, nil
}

func jsonOut(v any) output {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return output{Stdout: b}
}

// fullreport answers fullreport like LVM: every VG, or the VGs named after
// the options; a named VG that does not exist is left out and makes the
// exit status 5.
func (f *fakeLVM) fullreport(args []string) output {
	type sub struct {
		VG []jsonVG `json:"vg"`
		PV []jsonPV `json:"pv"`
		LV []jsonLV `json:"lv"`
	}
	named := args[slices.Index(args, "pvseg_size<0")+1:]
	var subs []sub
	var stderr []string
	for _, name := range named {
		if !slices.ContainsFunc(f.vgs, func(v jsonVG) bool { return v.Name == name }) {
			stderr = append(stderr, `  Volume group "`+name+`" not found`, "  Cannot process volume group "+name)
		}
	}
	for _, vg := range f.vgs {
		if len(named) > 0 && !slices.Contains(named, vg.Name) {
			continue
		}
		s := sub{VG: []jsonVG{vg}, PV: append([]jsonPV{}, f.pvs[vg.Name]...), LV: []jsonLV{}}
		for _, lv := range f.lvs {
			if lv.VG == vg.Name {
				s.LV = append(s.LV, lv)
			}
		}
		subs = append(subs, s)
	}
	out := jsonOut(map[string]any{"report": subs})
	if len(stderr) > 0 {
		out.ExitCode, out.Stderr = 5, []byte(strings.Join(stderr, "\n"))
	}
	return out
}

// selection returns the value of "-S field=\"value\"" in args.
func selection(args []string, field string) (string, bool) {
	i := slices.Index(args, "-S")
	if i < 0 || i+1 >= len(args) {
		return "", false
	}
	v, ok := strings.CutPrefix(args[i+1], field+"=")
	return strings.Trim(v, `"`), ok
}

func (f *fakeLVM) vgsReport(args []string) output {
	name, _ := selection(args, "vg_name")
	rows := []jsonVG{}
	for _, vg := range f.vgs {
		if vg.Name == name {
			rows = append(rows, vg)
		}
	}
	return jsonOut(map[string]any{"report": []map[string]any{{"vg": rows}}})
}

func (f *fakeLVM) lvsReport(args []string) output {
	last := args[len(args)-1]
	rows := []jsonLV{}
	name, byName := selection(args, "lv_name")
	tag, byTag := strings.CutPrefix(last, "@")
	vg := ""
	if !byTag && !strings.HasPrefix(last, "-") && !strings.Contains(last, ",") {
		vg = last
		if !slices.ContainsFunc(f.vgs, func(v jsonVG) bool { return v.Name == vg }) {
			return output{ExitCode: 5, Stderr: []byte(`  Volume group "` + vg + `" not found`)}
		}
	}
	// Like LVM, "@tag" also selects every LV of a VG that has the tag.
	vgTagged := func(name string) bool {
		return slices.ContainsFunc(f.vgs, func(v jsonVG) bool { return v.Name == name && slices.Contains(splitTags(v.Tags), tag) })
	}
	for _, lv := range f.lvs {
		switch {
		case vg != "" && lv.VG != vg,
			byName && lv.Name != name,
			byTag && !slices.Contains(splitTags(lv.Tags), tag) && !vgTagged(lv.VG):
			continue
		}
		rows = append(rows, lv)
	}
	return jsonOut(map[string]any{"report": []map[string]any{{"lv": rows}}})
}

// failure is a recorded failed command: exit code and stderr.
func recordedFailures(t *testing.T, file string) map[string]recordedFailureFixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]recordedFailureFixture{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

type recordedFailureFixture struct {
	Args     []string `json:"args"`
	ExitCode int      `json:"exitCode"`
	Stderr   string   `json:"stderr"`
}

func (r recordedFailureFixture) output() output {
	return output{ExitCode: r.ExitCode, Stderr: []byte(r.Stderr)}
}

// activate answers `lvchange --activate y [--ignoreactivationskip] vg/lv`
// as LVM does: a missing LV fails, an LV with the activation-skip flag stays
// inactive unless the flag is ignored, and the exit status is 0 either way.
func (f *fakeLVM) activate(args []string) output {
	f.mu.Lock()
	defer f.mu.Unlock()
	vg, name, _ := strings.Cut(args[len(args)-1], "/")
	ignoreSkip := slices.Contains(args, "--ignoreactivationskip")
	for i := range f.lvs {
		lv := &f.lvs[i]
		if lv.VG != vg || lv.Name != name {
			continue
		}
		a := []byte(lv.Attr)
		skip := len(a) > 9 && a[9] == 'k'
		if len(a) > 4 && !f.activationFilter && (!skip || ignoreSkip) {
			a[4] = 'a'
			lv.Attr = string(a)
		}
		return output{}
	}
	return output{ExitCode: 5, Stderr: []byte(`  Failed to find logical volume "` + vg + "/" + name + `"`)}
}
