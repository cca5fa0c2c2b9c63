package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"fusebox.dev/localcluster/gpuctl"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one simulated GPU as the plugin advertises it.
type Device struct {
	Index  int    `json:"index"`
	ID     string `json:"id"`
	Health string `json:"health"`
}

// deviceID is the id of GPU number index on the node seeded by seed: shaped
// like an NVIDIA UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) and the same
// on every start, so allocations the kubelet checkpointed stay valid.
func deviceID(seed string, index int) string {
	sum := sha256.Sum256([]byte(seed + "/" + strconv.Itoa(index)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// readDevices returns the devices the control files describe, in index
// order, with ids seeded by seed.
func readDevices(control gpuctl.Files, seed string) ([]Device, error) {
	gpus, err := control.Read()
	if err != nil {
		return nil, err
	}
	devices := make([]Device, len(gpus))
	for i, g := range gpus {
		health := pluginapi.Healthy
		if !g.Healthy {
			health = pluginapi.Unhealthy
		}
		devices[i] = Device{Index: g.Index, ID: deviceID(seed, g.Index), Health: health}
	}
	return devices, nil
}

// writeDevices publishes the advertised devices for localcluster to read,
// replacing the file atomically.
func writeDevices(path string, devices []Device) error {
	body, err := json.MarshalIndent(devices, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, append(body, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func toPluginDevices(devices []Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devices))
	for i, d := range devices {
		out[i] = &pluginapi.Device{ID: d.ID, Health: d.Health}
	}
	return out
}

// visibleDevices is NVIDIA_VISIBLE_DEVICES for a container given ids, as the
// NVIDIA device plugin's envvar strategy sets it.
func visibleDevices(ids []string) string {
	return strings.Join(ids, ",")
}

func knownIDs(devices []Device) []string {
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = d.ID
	}
	return ids
}

func unknownIDs(devices []Device, requested []string) []string {
	known := knownIDs(devices)
	var unknown []string
	for _, id := range requested {
		if !slices.Contains(known, id) {
			unknown = append(unknown, id)
		}
	}
	return unknown
}
