// Package gpuctl reads the files through which localcluster steers a
// simulated-GPU component: a count file holding the number of GPUs, and a
// directory where a file named after a GPU's index marks that GPU unhealthy.
// The device plugin and the DRA driver each poll a directory of their own
// shaped this way; localcluster/gpu_control.py is the writing side.
package gpuctl

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Files are one component's control files.
type Files struct {
	CountFile    string // holds the number of GPUs; absent means DefaultCount
	DefaultCount int    // the cluster's configured count, for a start before CountFile exists
	UnhealthyDir string // a file named after a GPU's index marks it unhealthy
}

// Flags declares --count-file, --gpus and --unhealthy-dir on fs (localcluster's
// gpu_control.ControlFiles.flags writes them); the Files are filled in when fs
// is parsed.
func Flags(fs *flag.FlagSet) *Files {
	f := &Files{}
	fs.StringVar(&f.CountFile, "count-file", "", "file holding the number of GPUs")
	fs.IntVar(&f.DefaultCount, "gpus", 0, "number of GPUs while the count file does not exist")
	fs.StringVar(&f.UnhealthyDir, "unhealthy-dir", "", "directory where a file named after a GPU's index marks it unhealthy")
	return f
}

// GPU is one GPU as the control files describe it.
type GPU struct {
	Index   int
	Healthy bool
}

// Read returns the GPUs the files describe, in index order.
func (f Files) Read() ([]GPU, error) {
	count := f.DefaultCount
	raw, err := os.ReadFile(f.CountFile)
	switch {
	case err == nil:
		count, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || count < 0 {
			return nil, fmt.Errorf("%s: %q is not a GPU count", f.CountFile, strings.TrimSpace(string(raw)))
		}
	case !os.IsNotExist(err):
		return nil, err
	}
	unhealthy := map[int]bool{}
	entries, err := os.ReadDir(f.UnhealthyDir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, entry := range entries {
		if index, err := strconv.Atoi(entry.Name()); err == nil {
			unhealthy[index] = true
		}
	}
	gpus := make([]GPU, count)
	for i := range gpus {
		gpus[i] = GPU{Index: i, Healthy: !unhealthy[i]}
	}
	return gpus, nil
}
