package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

// none is what kubectl prints for an empty cell.
const none = "<none>"

// listing is one view's answer in every output form.
type listing struct {
	// rows is what -o json and -o yaml print (a list of view rows).
	rows any
	// names is what -o name prints, one kind/name per row.
	names []string
	// columns and cells are the table; Priority 1 columns show only with -o wide.
	columns []metav1.TableColumnDefinition
	cells   [][]any
	// namespaces, when set, fill a first NAMESPACE column with -A, as kubectl.
	namespaces []string
}

// col is a table column; wide ones show only with -o wide.
func col(name string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: "string"}
}

func wideCol(name string) metav1.TableColumnDefinition {
	c := col(name)
	c.Priority = 1
	return c
}

// print writes l as -o asks. ns is the namespace read ("" for all): an
// empty table says nothing was found there, as kubectl does.
func (o *options) print(l listing, ns string) error {
	out := o.streams.Out
	switch o.output {
	case "json":
		return writeJSON(out, orEmpty(l.rows))
	case "yaml":
		b, err := yaml.Marshal(orEmpty(l.rows))
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	case "name":
		for _, n := range l.names {
			if _, err := fmt.Fprintln(out, n); err != nil {
				return err
			}
		}
		return nil
	}
	if len(l.cells) == 0 {
		if ns != "" {
			say(o.streams.ErrOut, "No resources found in %s namespace.\n", ns)
		} else {
			say(o.streams.ErrOut, "No resources found\n")
		}
		return nil
	}
	t := &metav1.Table{ColumnDefinitions: l.columns}
	withNS := o.allNamespaces && l.namespaces != nil
	if withNS {
		t.ColumnDefinitions = append([]metav1.TableColumnDefinition{col("Namespace")}, l.columns...)
	}
	for i, cells := range l.cells {
		if withNS {
			cells = append([]any{l.namespaces[i]}, cells...)
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: cells})
	}
	return printers.NewTablePrinter(printers.PrintOptions{NoHeaders: o.noHeaders, Wide: o.output == "wide"}).PrintObj(t, out)
}

// orEmpty makes a nil list print as [] rather than null.
func orEmpty(rows any) any {
	if b, err := json.Marshal(rows); err == nil && string(b) == "null" {
		return []any{}
	}
	return rows
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// size prints bytes as a Kubernetes quantity (1Gi).
func size(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// age is kubectl's AGE (5m, 26h, 3d); <unknown> for no time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}
