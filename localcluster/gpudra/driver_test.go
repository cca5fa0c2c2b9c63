package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"fusebox.dev/localcluster/gpuctl"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestUUIDsAreStableUUIDShapedAndDistinctFromTheDevicePlugins(t *testing.T) {
	shape := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	if !shape.MatchString(gpuUUID("n", 0)) || gpuUUID("n", 0) != gpuUUID("n", 0) {
		t.Fatalf("%q is not a stable NVIDIA-shaped UUID", gpuUUID("n", 0))
	}
	if gpuUUID("n", 0) == gpuUUID("n", 1) || gpuUUID("n", 0) == gpuUUID("m", 0) {
		t.Fatal("distinct GPUs share a UUID")
	}
}

func TestGPUsTakeTheirCountAndHealthFromTheControlFiles(t *testing.T) {
	dir := t.TempDir()
	control := gpuctl.Files{CountFile: filepath.Join(dir, "count"), DefaultCount: 1, UnhealthyDir: filepath.Join(dir, "unhealthy")}
	if gpus, err := readGPUs(control, "n"); err != nil || len(gpus) != 1 {
		t.Fatalf("no count file: want the default count, got %v, %v", gpus, err)
	}
	must(t, os.WriteFile(control.CountFile, []byte("2\n"), 0o644))
	must(t, os.MkdirAll(control.UnhealthyDir, 0o755))
	must(t, os.WriteFile(filepath.Join(control.UnhealthyDir, "1"), nil, 0o644))
	gpus, err := readGPUs(control, "n")
	must(t, err)
	if len(gpus) != 2 || !gpus[0].Healthy || gpus[1].Healthy || gpus[1].UUID != gpuUUID("n", 1) {
		t.Fatalf("want 2 GPUs, the second unhealthy with its seeded UUID; got %v", gpus)
	}
	must(t, os.WriteFile(control.CountFile, []byte("many"), 0o644))
	if _, err := readGPUs(control, "n"); err == nil {
		t.Fatal("a count that is not a number was accepted")
	}
}

func TestSliceListsEachGPUWithNVIDIAAttributesAndMemory(t *testing.T) {
	devices := sliceDevices([]GPU{{0, "GPU-a", true}, {1, "GPU-b", true}}, Product{"NVIDIA-H100-80GB-HBM3", 1024})
	if len(devices) != 2 || devices[1].Name != "gpu-1" {
		t.Fatalf("devices: %v", devices)
	}
	attrs := devices[1].Attributes
	if *attrs["productName"].StringValue != "NVIDIA-H100-80GB-HBM3" || *attrs["uuid"].StringValue != "GPU-b" || *attrs["index"].IntValue != 1 {
		t.Fatalf("attributes: %v", attrs)
	}
	if memory := devices[1].Capacity["memory"].Value; memory.String() != "1Gi" {
		t.Fatalf("memory capacity %s, want 1Gi", memory.String())
	}
}

func TestAnUnhealthyGPUIsTaintedSoNoNewClaimGetsIt(t *testing.T) {
	devices := sliceDevices([]GPU{{0, "GPU-a", true}, {1, "GPU-b", false}}, Product{"p", 1})
	if len(devices[0].Taints) != 0 {
		t.Fatalf("a healthy GPU is tainted: %v", devices[0].Taints)
	}
	if len(devices[1].Taints) != 1 || devices[1].Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("the unhealthy GPU's taints: %v", devices[1].Taints)
	}
}

func allocatedClaim(uid types.UID, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: uid},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

func TestPrepareWritesACDISpecWithTheAllocatedUUIDsAndUnprepareRemovesIt(t *testing.T) {
	dir := CDIDir(t.TempDir())
	d := newDriver("node", dir, []GPU{{0, "GPU-a", true}, {1, "GPU-b", true}})
	claim := allocatedClaim("uid-1",
		resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driverName, Pool: "node", Device: "gpu-1"},
		resourceapi.DeviceRequestAllocationResult{Request: "other", Driver: "other.example.com", Pool: "node", Device: "x"},
	)
	results, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	must(t, err)
	result := results["uid-1"]
	must(t, result.Err)
	if len(result.Devices) != 1 || result.Devices[0].DeviceName != "gpu-1" || result.Devices[0].CDIDeviceIDs[0] != "k8s.gpu.nvidia.com/claim=uid-1-gpu-1" {
		t.Fatalf("prepared devices: %+v", result.Devices)
	}
	var spec cdiSpec
	raw, err := os.ReadFile(dir.path("uid-1"))
	must(t, err)
	must(t, json.Unmarshal(raw, &spec))
	if spec.Kind != "k8s.gpu.nvidia.com/claim" || len(spec.Devices) != 1 || spec.Devices[0].Name != "uid-1-gpu-1" || spec.Devices[0].ContainerEdits.Env[0] != "NVIDIA_VISIBLE_DEVICES=GPU-b" {
		t.Fatalf("CDI spec: %s", raw)
	}
	object := kubeletplugin.NamespacedObject{UID: "uid-1"}
	for range 2 { // idempotent: the kubelet may ask again
		errs, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{object})
		must(t, err)
		must(t, errs["uid-1"])
	}
	if _, err := os.Stat(dir.path("uid-1")); !os.IsNotExist(err) {
		t.Fatalf("the CDI spec outlived its claim: %v", err)
	}
}

func TestPrepareRefusesUnallocatedClaimsAndDevicesNotOnThisNode(t *testing.T) {
	d := newDriver("node", CDIDir(t.TempDir()), []GPU{{0, "GPU-a", true}})
	unallocated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: "u"}}
	elsewhere := allocatedClaim("e", resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driverName, Pool: "other-node", Device: "gpu-0"})
	unknown := allocatedClaim("k", resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driverName, Pool: "node", Device: "gpu-7"})
	results, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{unallocated, elsewhere, unknown})
	must(t, err)
	for _, uid := range []types.UID{"u", "e", "k"} {
		if results[uid].Err == nil {
			t.Fatalf("claim %s was prepared", uid)
		}
	}
}

func TestHealthStreamSendsEveryGPUAndAgainOnAChange(t *testing.T) {
	d := newDriver("node", CDIDir(t.TempDir()), []GPU{{0, "GPU-a", true}})
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	first := <-reports
	if len(first.Devices) != 1 || first.Devices[0].Health != kubeletplugin.HealthStatusHealthy || first.Devices[0].PoolName != "node" {
		t.Fatalf("first report: %+v", first)
	}
	d.update([]GPU{{0, "GPU-a", false}})
	select {
	case second := <-reports:
		if second.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy || second.Devices[0].DeviceName != "gpu-0" {
			t.Fatalf("after marking gpu-0 unhealthy: %+v", second)
		}
	case <-time.After(healthResend / 2):
		t.Fatal("a health change was not sent before the periodic resend")
	}
	cancel()
	must(t, <-done)
}

func TestAClaimOfTwoGPUsGivesEachItsOwnCDIDeviceAndBothTheSameVisibleDevices(t *testing.T) {
	spec := specFor("uid", []GPU{{0, "GPU-a", true}, {1, "GPU-b", true}})
	if len(spec.Devices) != 2 || spec.Devices[0].Name != "uid-gpu-0" || spec.Devices[1].Name != "uid-gpu-1" {
		t.Fatalf("CDI devices: %+v", spec.Devices)
	}
	for _, device := range spec.Devices {
		if device.ContainerEdits.Env[0] != "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b" {
			t.Fatalf("%s sets %v", device.Name, device.ContainerEdits.Env)
		}
	}
}
