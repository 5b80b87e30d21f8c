//go:build deploytest

package deploy

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/volume"
)

// schemaNode is one JSON-schema object of values.schema.json.
type schemaNode map[string]any

func loadSchema(t *testing.T) schemaNode {
	t.Helper()
	data := readRepoFile(t, "deploy", "helm", "carve", "values.schema.json")
	var s schemaNode
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return s
}

// at walks a path of property names (and "items") from root, following
// the local $refs ("#/definitions/x") on the way.
func (s schemaNode) at(t *testing.T, root schemaNode, path ...string) schemaNode {
	t.Helper()
	n := s
	for i := 0; ; i++ {
		if ref, ok := n["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, "#/definitions/")
			if !found {
				t.Fatalf("values.schema.json: $ref %q is not a local definition", ref)
			}
			defs, _ := root["definitions"].(map[string]any)
			d, _ := defs[name].(map[string]any)
			if d == nil {
				t.Fatalf("values.schema.json: $ref %q names no definition", ref)
			}
			n = d
		}
		if i == len(path) {
			return n
		}
		var next map[string]any
		if path[i] == "items" {
			next, _ = n["items"].(map[string]any)
		} else {
			props, _ := n["properties"].(map[string]any)
			next, _ = props[path[i]].(map[string]any)
		}
		if next == nil {
			t.Fatalf("values.schema.json has no %s", strings.Join(path[:i+1], "."))
		}
		n = next
	}
}

func (s schemaNode) propertyNames() []string {
	props, _ := s["properties"].(map[string]any)
	return sortedKeys(props)
}

// jsonKeys are the keys encoding/json decodes into struct type typ: every
// exported field's json tag name.
func jsonKeys(typ reflect.Type) map[string]reflect.Type {
	keys := map[string]reflect.Type{}
	for f := range typ.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		keys[name] = f.Type
	}
	return keys
}

// checkKeysMatch compares the keys a config struct decodes with a schema
// object's properties, in both directions, and recurses into nested
// structs (lvcreateOptions).
func checkKeysMatch(t *testing.T, root, node schemaNode, where string, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	keys := jsonKeys(typ)
	if ap, ok := node["additionalProperties"].(bool); !ok || ap {
		t.Errorf("%s: the schema must set additionalProperties: false, so a typo fails the install", where)
	}
	got := node.propertyNames()
	for _, k := range sortedKeys(keys) {
		if !slices.Contains(got, k) {
			t.Errorf("%s: internal/node/deviceclass decodes %q (%s), but values.schema.json refuses it", where, k, typ)
		}
	}
	for _, k := range got {
		ft, ok := keys[k]
		if !ok {
			t.Errorf("%s: values.schema.json accepts %q, which internal/node/deviceclass's %s does not decode", where, k, typ)
			continue
		}
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() != "k8s.io/apimachinery/pkg/api/resource" {
			checkKeysMatch(t, root, node.at(t, root, k), where+"."+k, ft)
		}
	}
}

// TestSchemaMatchesDeviceClassConfig: the chart's schema accepts exactly
// the device-class keys internal/node/deviceclass decodes, at both places the chart takes
// device classes (deviceClasses and nodeGroups[].deviceClasses), and the
// values it enumerates are carve's own lists; so the two cannot drift.
func TestSchemaMatchesDeviceClassConfig(t *testing.T) {
	root := loadSchema(t)
	typ := reflect.TypeFor[deviceclass.DeviceClass]()
	for _, path := range [][]string{
		{"deviceClasses", "items"},
		{"nodeGroups", "items", "deviceClasses", "items"},
	} {
		where := strings.Join(path, ".")
		node := root.at(t, root, path...)
		checkKeysMatch(t, root, node, where, typ)

		var methods []string
		for _, m := range erase.Methods {
			methods = append(methods, string(m))
		}
		if got := enumOf(root.at(t, root, append(slices.Clone(path), "erase")...)); !sameSet(got, methods) {
			t.Errorf("%s.erase: the schema allows %q, internal/node/erase's methods are %q", where, got, methods)
		}
		mkfs := root.at(t, root, append(slices.Clone(path), "mkfsOptions")...)
		if got := mkfs.propertyNames(); !sameSet(got, fs.MkfsTypes) {
			t.Errorf("%s.mkfsOptions: the schema takes %q, internal/node/fs's filesystems are %q", where, got, fs.MkfsTypes)
		}
		name := root.at(t, root, append(slices.Clone(path), "name")...)
		checkNamePattern(t, where+".name", name)
	}
	if got := enumOf(root.at(t, root, "storageClasses", "items", "fsType")); !sameSet(got, fs.MkfsTypes) {
		t.Errorf("storageClasses.fsType: the schema allows %q, internal/node/fs's filesystems are %q", got, fs.MkfsTypes)
	}
	checkNamePattern(t, "storageClasses.deviceClass", root.at(t, root, "storageClasses", "items", "deviceClass"))
}

func enumOf(n schemaNode) []string {
	var out []string
	e, _ := n["enum"].([]any)
	for _, v := range e {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// checkNamePattern: the schema's pattern for a device-class name agrees
// with deviceclass.IsClassName on names either side of the rules.
func checkNamePattern(t *testing.T, where string, n schemaNode) {
	t.Helper()
	pat, _ := n["pattern"].(string)
	re, err := regexp.Compile(pat)
	if err != nil {
		t.Fatalf("%s: pattern %q: %v", where, pat, err)
	}
	maxLen, _ := n["maxLength"].(float64)
	for _, name := range []string{"a", "thick", "fast-1", "A", "-a", "a-", "a_b", "a.b", strings.Repeat("a", 63), strings.Repeat("a", 64)} {
		schema := re.MatchString(name) && (maxLen == 0 || len(name) <= int(maxLen))
		if schema != deviceclass.IsClassName(name) {
			t.Errorf("%s: the schema says %q is a class name: %v; internal/node/deviceclass says %v", where, name, schema, deviceclass.IsClassName(name))
		}
	}
}

// passThroughPrefix reads internal/node/driver's paramPassThroughPrefix, the prefix
// of the StorageClass parameters CreateVolume accepts besides the device
// class, from its source (it is not exported).
func passThroughPrefix(t *testing.T) string {
	t.Helper()
	file := filepath.Join(repoRoot(t), "internal", "node", "driver", "validate.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			for i, n := range v.Names {
				if n.Name != "paramPassThroughPrefix" {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s: paramPassThroughPrefix is not a string literal", file)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
		}
	}
	t.Fatalf("%s declares no paramPassThroughPrefix: update this test to carve's parameter rules", file)
	return ""
}

// TestSchemaRefusesParametersCarveRefuses: a StorageClass parameter that
// CreateVolume would answer InvalidArgument (leaving every claim Pending)
// fails `helm install` instead. carve accepts carve.dev/device-class (the
// chart sets it from deviceClass) and keys with internal/node/driver's pass-through
// prefix (the chart sets csi.storage.k8s.io/fstype from fsType).
func TestSchemaRefusesParametersCarveRefuses(t *testing.T) {
	root := loadSchema(t)
	prefix := passThroughPrefix(t)
	params := root.at(t, root, "storageClasses", "items", "parameters")
	names, _ := params["propertyNames"].(map[string]any)
	if got, want := names["pattern"], "^("+regexp.QuoteMeta(prefix)+"|"+regexp.QuoteMeta(router.ParamCrossNodeCopy)+"$)"; got != want {
		t.Errorf("storageClasses[].parameters: key pattern %q, want %q (internal/node/driver's paramPassThroughPrefix, internal/controller/router's ParamCrossNodeCopy)", got, want)
	}
	tmpl := readRepoFile(t, "deploy", "helm", "carve", "templates", "storageclasses.yaml")
	if !strings.Contains(string(tmpl), volume.ParamDeviceClass+":") {
		t.Errorf("templates/storageclasses.yaml does not set %s", volume.ParamDeviceClass)
	}
	const base = "storageClasses: [{name: x, deviceClass: thick, parameters: {%q: v}}]\n"
	for _, tc := range []struct {
		key  string
		want string // "" = accepted
	}{
		{prefix + "provisioner-secret-name", ""},
		{"carve.dev/device-class", "does not match pattern"},
		{"fsType", "does not match pattern"},
		{"carve.dev/stripes", "does not match pattern"},
		{prefix + "fstype", "'not' failed"},
		{router.ParamCrossNodeCopy, ""},
		{router.ParamCrossNodeCopy + "-x", "does not match pattern"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			_, err := renderValues(t, strings.ReplaceAll(base, "%q", strconv.Quote(tc.key)))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("helm template refused parameter %q, which carve accepts: %v", tc.key, err)
			case tc.want != "" && err == nil:
				t.Errorf("helm template accepted parameter %q, which carve's CreateVolume refuses", tc.key)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("helm template's error for %q does not say %q:\n%v", tc.key, tc.want, err)
			}
		})
	}
}

// TestChartTakesEveryDocumentedDeviceClassKey: the keys docs/configuration.md
// tells database teams to set install, at both places.
func TestChartTakesEveryDocumentedDeviceClassKey(t *testing.T) {
	const class = `{name: %s, volumeGroup: vg, erase: write, snapshotSpacePercent: 40, mkfsOptions: {ext4: ["-O", "^orphan_file"], xfs: []}, lvcreateOptions: {stripes: 2}}`
	values := "deviceClasses: [" + strings.Replace(class, "%s", "thick", 1) + "]\n" +
		"nodeGroups: [{name: g, deviceClasses: [" + strings.Replace(class, "%s", "fast", 1) + "]}]\nstorageClasses: []\n"
	objs, err := renderValues(t, values)
	if err != nil {
		t.Fatalf("helm template refused documented device-class keys: %v", err)
	}
	var found int
	for _, o := range objs {
		if o.kind() != "ConfigMap" || !strings.HasPrefix(o.meta("name"), "carve-device-classes") {
			continue
		}
		data, _ := o["data"].(map[string]any)
		for _, v := range data {
			s, _ := v.(string)
			cfg, err := deviceclass.Parse([]byte(s))
			if err != nil {
				t.Errorf("%s: internal/node/deviceclass refuses the rendered file: %v\n%s", o.key(), err, s)
				continue
			}
			for _, d := range cfg.DeviceClasses {
				found++
				if d.Erase != erase.Write || d.SnapshotSpacePercent != 40 || len(d.MkfsOptions["ext4"]) != 2 {
					t.Errorf("%s: class %s lost keys on the way: %+v", o.key(), d.Name, d)
				}
			}
		}
	}
	if found != 2 {
		t.Errorf("found %d device classes in the rendered ConfigMaps, want 2", found)
	}
}
