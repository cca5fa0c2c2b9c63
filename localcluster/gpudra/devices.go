package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"fusebox.dev/localcluster/gpuctl"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// GPU is one simulated GPU as the driver publishes it.
type GPU struct {
	Index   int
	UUID    string
	Healthy bool
}

// Name is the device's name in the ResourceSlice: gpu-<index>, as NVIDIA's
// DRA driver names whole GPUs.
func (g GPU) Name() string { return "gpu-" + strconv.Itoa(g.Index) }

// gpuUUID is the UUID of GPU number index on the node seeded by seed: shaped
// like an NVIDIA UUID and the same on every start, so prepared claims stay valid.
func gpuUUID(seed string, index int) string {
	sum := sha256.Sum256([]byte(seed + "/dra/" + strconv.Itoa(index)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// readGPUs returns the GPUs the control files describe, in index order, with
// UUIDs seeded by seed.
func readGPUs(control gpuctl.Files, seed string) ([]GPU, error) {
	described, err := control.Read()
	if err != nil {
		return nil, err
	}
	gpus := make([]GPU, len(described))
	for i, g := range described {
		gpus[i] = GPU{Index: g.Index, UUID: gpuUUID(seed, g.Index), Healthy: g.Healthy}
	}
	return gpus, nil
}

// Product is what every simulated GPU on the node is.
type Product struct {
	Name      string // e.g. NVIDIA-H100-80GB-HBM3, GPU Feature Discovery's product label
	MemoryMiB int64
}

// unhealthyTaint keeps the scheduler from allocating an unhealthy GPU to a new
// claim, as the device manager stops offering a device plugin's unhealthy
// device; NoSchedule, not NoExecute: the pod holding it is left to drain.
var unhealthyTaint = resourceapi.DeviceTaint{Key: driverName + "/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}

// sliceDevices is what the ResourceSlice lists: each GPU with NVIDIA's DRA
// driver's attribute names (productName, uuid, index) and its memory as a
// capacity, so a DeviceClass or a claim can select on them with CEL; an
// unhealthy GPU carries a taint. Pure.
func sliceDevices(gpus []GPU, product Product) []resourceapi.Device {
	devices := make([]resourceapi.Device, len(gpus))
	for i, g := range gpus {
		var taints []resourceapi.DeviceTaint
		if !g.Healthy {
			taints = []resourceapi.DeviceTaint{unhealthyTaint}
		}
		devices[i] = resourceapi.Device{
			Taints: taints,
			Name:   g.Name(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":        {StringValue: ptr.To("gpu")},
				"productName": {StringValue: ptr.To(product.Name)},
				"uuid":        {StringValue: ptr.To(g.UUID)},
				"index":       {IntValue: ptr.To(int64(g.Index))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(product.MemoryMiB*1024*1024, resource.BinarySI)},
			},
		}
	}
	return devices
}
