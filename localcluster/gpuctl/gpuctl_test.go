package gpuctl

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

func TestFilesGiveCountAndHealth(t *testing.T) {
	dir := t.TempDir()
	files := Files{CountFile: filepath.Join(dir, "count"), UnhealthyDir: filepath.Join(dir, "unhealthy")}
	if gpus, err := files.Read(); err != nil || len(gpus) != 0 {
		t.Fatalf("no count file: want no GPUs, got %v, %v", gpus, err)
	}
	files.DefaultCount = 2
	if gpus, err := files.Read(); err != nil || len(gpus) != 2 {
		t.Fatalf("no count file: want the default count, got %v, %v", gpus, err)
	}
	must(t, os.WriteFile(files.CountFile, []byte("3\n"), 0o644))
	must(t, os.MkdirAll(files.UnhealthyDir, 0o755))
	must(t, os.WriteFile(filepath.Join(files.UnhealthyDir, "1"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(files.UnhealthyDir, "notes"), nil, 0o644))
	gpus, err := files.Read()
	must(t, err)
	want := []GPU{{0, true}, {1, false}, {2, true}}
	if len(gpus) != len(want) || gpus[0] != want[0] || gpus[1] != want[1] || gpus[2] != want[2] {
		t.Fatalf("want %v (the second unhealthy, a file not named after an index ignored); got %v", want, gpus)
	}
	for _, count := range []string{"many", "-1"} {
		must(t, os.WriteFile(files.CountFile, []byte(count), 0o644))
		if _, err := files.Read(); err == nil {
			t.Fatalf("the count %q was accepted", count)
		}
	}
}

func TestFlagsFillTheFilesWhenParsed(t *testing.T) {
	fs := flag.NewFlagSet("plugin", flag.ContinueOnError)
	files := Flags(fs)
	must(t, fs.Parse([]string{"--count-file=/s/count", "--gpus=2", "--unhealthy-dir=/s/unhealthy"}))
	if want := (Files{CountFile: "/s/count", DefaultCount: 2, UnhealthyDir: "/s/unhealthy"}); *files != want {
		t.Fatalf("want %+v, got %+v", want, *files)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
