package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"fusebox.dev/localcluster/gpuctl"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestDeviceIDsAreStableUUIDShapedAndDistinct(t *testing.T) {
	shape := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	if !shape.MatchString(deviceID("fusebox", 0)) {
		t.Fatalf("%q is not shaped like an NVIDIA UUID", deviceID("fusebox", 0))
	}
	if deviceID("fusebox", 0) != deviceID("fusebox", 0) {
		t.Fatal("the same seed and index gave two ids")
	}
	if deviceID("fusebox", 0) == deviceID("fusebox", 1) || deviceID("fusebox", 0) == deviceID("other", 0) {
		t.Fatal("distinct GPUs share an id")
	}
}

func TestDevicesTakeTheirCountAndHealthFromTheControlFiles(t *testing.T) {
	dir := t.TempDir()
	control := gpuctl.Files{CountFile: filepath.Join(dir, "count"), UnhealthyDir: filepath.Join(dir, "unhealthy")}
	must(t, os.WriteFile(control.CountFile, []byte("3\n"), 0o644))
	must(t, os.MkdirAll(control.UnhealthyDir, 0o755))
	must(t, os.WriteFile(filepath.Join(control.UnhealthyDir, "1"), nil, 0o644))
	devices, err := readDevices(control, "n")
	must(t, err)
	health := []string{devices[0].Health, devices[1].Health, devices[2].Health}
	if len(devices) != 3 || health[0] != "Healthy" || health[1] != "Unhealthy" || health[2] != "Healthy" {
		t.Fatalf("want 3 devices, the second unhealthy; got %v", devices)
	}
	if devices[2].Index != 2 || devices[2].ID != deviceID("n", 2) {
		t.Fatalf("the third device is %v, not GPU 2 with its seeded id", devices[2])
	}
	must(t, os.WriteFile(control.CountFile, []byte("many"), 0o644))
	if _, err := readDevices(control, "n"); err == nil {
		t.Fatal("a count that is not a number was accepted")
	}
}

func TestAllocateGivesVisibleDevicesAndRefusesUnknownIDs(t *testing.T) {
	first, second := deviceID("n", 0), deviceID("n", 1)
	p := newPlugin("nvidia.com/gpu", "/x.sock", []Device{{0, first, "Healthy"}, {1, second, "Healthy"}})
	response, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{second, first}}},
	})
	must(t, err)
	if got := response.ContainerResponses[0].Envs[envVisibleDevices]; got != second+","+first {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q", got)
	}
	_, err = p.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}},
	})
	if err == nil {
		t.Fatal("an id the plugin never advertised was allocated")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDevicesArePublishedIntoADirectoryNotYetThere(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus", "devices.json")
	must(t, writeDevices(path, []Device{{0, deviceID("n", 0), "Healthy"}}))
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
