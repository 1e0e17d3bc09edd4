package task

import (
	"reflect"
	"strings"
	"testing"
)

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// TestKinds_CoverExecutorFields fails when an Executor field is in no
// kind's fields, or in two: DecodeTask would refuse it as unknown, or
// validation could not say which type it belongs to.
func TestKinds_CoverExecutorFields(t *testing.T) {
	for f := range reflect.TypeFor[Executor]().Fields() {
		name := jsonName(f)
		if name == "type" {
			continue
		}
		n := 0
		for _, k := range kinds {
			for _, kf := range k.fields {
				if kf.name == name {
					n++
				}
			}
		}
		if n != 1 {
			t.Errorf("Executor field %s (%q) is in %d kinds' fields, want 1", f.Name, name, n)
		}
	}
	for _, k := range kinds {
		if k.build == nil {
			t.Errorf("kind %s has no build", k.typ)
		}
	}
}
