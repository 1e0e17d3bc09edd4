package ring

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The partition of an id is stored in etcd keys: these values must never
// change. "" and "abc" are XXH64's published test vectors.
func TestPartition_Golden(t *testing.T) {
	tests := []struct {
		id         string
		partitions int
		want       int
	}{
		{"", 1024, 409},    // xxhash64 = 0xef46db3751d8e999
		{"abc", 1024, 409}, // xxhash64 = 0x44bc2cf5ad770999
		{"abc", 7, 0},      // 0x44bc2cf5ad770999 % 7
		{"", 7, 6},         // 0xef46db3751d8e999 % 7
		{"billing/invoice-42", 1024, 14},
		{"billing/invoice-42", 4096, 1038},
		{"0123456789abcdef", 1024, 267},
		{"0123456789abcdef", 7, 6},
		{"0123456789abcdef", 4096, 3339},
		{"anything", 1, 0},
	}
	for _, tt := range tests {
		if got := Partition(tt.id, tt.partitions); got != tt.want {
			t.Errorf("Partition(%q, %d) = %d, want %d", tt.id, tt.partitions, got, tt.want)
		}
	}
}

func TestPartition_InRange(t *testing.T) {
	for _, p := range []int{-5, 0, 1, 2, 7, 1024, 4096, MaxPartitions} {
		for i := range 2000 {
			id := fmt.Sprintf("task-%d", i)
			got := Partition(id, p)
			if p < 2 {
				if got != 0 {
					t.Fatalf("Partition(%q, %d) = %d, want 0", id, p, got)
				}
				continue
			}
			if got < 0 || got >= p {
				t.Fatalf("Partition(%q, %d) = %d, out of range", id, p, got)
			}
			if want := int(xxhash.Sum64([]byte(id)) % uint64(p)); got != want {
				t.Fatalf("Partition(%q, %d) = %d, want xxhash64 %% P = %d", id, p, got, want)
			}
		}
	}
}

func TestPartition_NoAlloc(t *testing.T) {
	id := "0123456789abcdef"
	if n := testing.AllocsPerRun(100, func() { _ = Partition(id, 1024) }); n != 0 {
		t.Fatalf("Partition allocates %v times per call", n)
	}
}

func FuzzPartition(f *testing.F) {
	for _, s := range []string{"", "abc", "billing/invoice-42", "\x00\xff"} {
		f.Add(s, 1024)
		f.Add(s, 7)
	}
	f.Fuzz(func(t *testing.T, id string, p int) {
		got := Partition(id, p)
		if p < 2 {
			if got != 0 {
				t.Fatalf("Partition(%q, %d) = %d, want 0", id, p, got)
			}
			return
		}
		if got < 0 || got >= p || got != int(xxhash.Sum64String(id)%uint64(p)) {
			t.Fatalf("Partition(%q, %d) = %d", id, p, got)
		}
	})
}

func TestRanges_SortedRuns(t *testing.T) {
	for _, tc := range []struct {
		ps   []int
		want string
	}{
		{nil, ""},
		{[]int{7}, "7"},
		{[]int{3, 1, 2}, "1-3"},
		{[]int{0, 1, 2, 5, 7, 8, 8, 1023}, "0-2,5,7-8,1023"},
	} {
		in := slices.Clone(tc.ps)
		if got := Ranges(tc.ps); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.ps, got, tc.want)
		}
		if !slices.Equal(in, tc.ps) {
			t.Errorf("Ranges changed its argument: %v, was %v", tc.ps, in)
		}
	}
}
