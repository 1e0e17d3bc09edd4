package bench

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// median returns one Result whose every figure is the median of that
// figure over rs (for an even count, the lower of the two middle ones:
// a figure some run measured). Charts come from the run whose lag p99 is
// the median; the note lists the figures of correctness (duplicates,
// misses, misfires, trigger keys left) run by run where they differ.
func median(rs []*Result) *Result {
	if len(rs) == 1 {
		return rs[0]
	}
	byLag := slices.Clone(rs)
	slices.SortStableFunc(byLag, func(a, b *Result) int { return cmpFloat(a.LagP99Ms, b.LagP99Ms) })
	out := *byLag[(len(rs)-1)/2]
	srcs := make([]reflect.Value, len(rs))
	for j, r := range rs {
		srcs[j] = reflect.ValueOf(r).Elem()
	}
	setMedians(reflect.ValueOf(&out).Elem(), srcs)
	out.Runs = len(rs)
	var notes []string
	for _, fl := range []struct {
		name string
		get  func(r *Result) uint64
	}{
		{"duplicates", func(r *Result) uint64 { return r.Duplicates }},
		{"missed", func(r *Result) uint64 { return r.Missed }},
		{"misfires", func(r *Result) uint64 { return r.Misfires }},
		{"leave duplicates", func(r *Result) uint64 { return r.Leave.Duplicates }},
		{"leave missed", func(r *Result) uint64 { return r.Leave.Missed }},
		{"leave misfires", func(r *Result) uint64 { return r.Leave.Misfires }},
		{"rejoin duplicates", func(r *Result) uint64 { return r.Rejoin.Duplicates }},
		{"rejoin missed", func(r *Result) uint64 { return r.Rejoin.Missed }},
		{"rejoin misfires", func(r *Result) uint64 { return r.Rejoin.Misfires }},
		{"trigger keys left", func(r *Result) uint64 { return r.TriggerKeysLeft }},
	} {
		var each []string
		differ := false
		for _, r := range rs {
			each = append(each, fmt.Sprint(fl.get(r)))
			differ = differ || fl.get(r) != fl.get(rs[0])
		}
		if differ {
			notes = append(notes, fl.name+" by run "+strings.Join(each, ", "))
		}
	}
	out.Note = strings.Join(append(notes, rs[0].Note), "; ")
	out.Note = strings.TrimSuffix(out.Note, "; ")
	return &out
}

// setMedians sets every figure of dst, a struct, to the median of that
// figure over srcs, structs of the same type, and so within its structs.
func setMedians(dst reflect.Value, srcs []reflect.Value) {
	for i := range dst.NumField() {
		f := dst.Field(i)
		vals := make([]reflect.Value, len(srcs))
		for j, src := range srcs {
			vals[j] = src.Field(i)
		}
		switch f.Kind() {
		case reflect.Int, reflect.Uint64, reflect.Float64:
			slices.SortFunc(vals, func(a, b reflect.Value) int { return cmpFloat(num(a), num(b)) })
			f.Set(vals[(len(vals)-1)/2])
		case reflect.Struct:
			setMedians(f, vals)
		}
	}
}

func num(v reflect.Value) float64 {
	switch v.Kind() {
	case reflect.Int:
		return float64(v.Int())
	case reflect.Uint64:
		return float64(v.Uint())
	}
	return v.Float()
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
