package main

import (
	"context"
	"fmt"
	"log"
	"reflect"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// driverName is the name NVIDIA's DRA driver publishes its GPUs under.
const driverName = "gpu.nvidia.com"

// healthResend is how often the health stream repeats itself when nothing
// changed: the kubelet treats a device not reported for 30 s as Unknown.
const healthResend = 10 * time.Second

// driver prepares claims for the node's simulated GPUs and streams their
// health; it is what kubeletplugin.Start serves to the kubelet.
type driver struct {
	pool string // the node's name: one pool per node
	cdi  CDIDir

	mu      sync.Mutex
	gpus    []GPU
	changed chan struct{} // closed and replaced whenever gpus change
}

func newDriver(pool string, cdi CDIDir, gpus []GPU) *driver {
	return &driver{pool: pool, cdi: cdi, gpus: gpus, changed: make(chan struct{})}
}

// update replaces the GPUs; reports whether anything changed.
func (d *driver) update(gpus []GPU) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reflect.DeepEqual(d.gpus, gpus) {
		return false
	}
	d.gpus = gpus
	close(d.changed)
	d.changed = make(chan struct{})
	return true
}

func (d *driver) snapshot() ([]GPU, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gpus, d.changed
}

// PrepareResourceClaims writes a CDI spec per claim naming the UUIDs of the
// GPUs the scheduler allocated to it from this node's pool.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	gpus, _ := d.snapshot()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		results[claim.UID] = d.prepare(claim, gpus)
	}
	return results, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim, gpus []GPU) kubeletplugin.PrepareResult {
	allocated, held, err := d.allocatedGPUs(claim, gpus)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if err := d.cdi.Write(claim.UID, held); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("writing the CDI spec: %w", err)}
	}
	log.Printf("prepared claim %s/%s: %v", claim.Namespace, claim.Name, held)
	return kubeletplugin.PrepareResult{Devices: allocated}
}

// allocatedGPUs is what claim's allocation holds of this driver's pool: the
// devices as the kubelet wants them, and the GPUs. Pure.
func (d *driver) allocatedGPUs(claim *resourceapi.ResourceClaim, gpus []GPU) ([]kubeletplugin.Device, []GPU, error) {
	if claim.Status.Allocation == nil {
		return nil, nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	byName := make(map[string]GPU, len(gpus))
	for _, g := range gpus {
		byName[g.Name()] = g
	}
	var devices []kubeletplugin.Device
	var held []GPU
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != driverName {
			continue
		}
		g, ok := byName[result.Device]
		if result.Pool != d.pool || !ok {
			return nil, nil, fmt.Errorf("claim %s/%s: device %s/%s is not on this node", claim.Namespace, claim.Name, result.Pool, result.Device)
		}
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{cdiDeviceID(claim.UID, g.Name())},
		})
		held = append(held, g)
	}
	return devices, held, nil
}

// UnprepareResourceClaims removes the claims' CDI specs; the spec file is the
// only state, so an unprepare after a restart of the driver works too.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		results[claim.UID] = d.cdi.Remove(claim.UID)
		log.Printf("unprepared claim %s", claim)
	}
	return results, nil
}

// HandleError logs errors met in the background (publishing the slice): the
// helper retries them, and none of this driver's slices can be invalid.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
}

// WatchHealthStatus sends every GPU's health at once, on every change, and
// again every healthResend so the kubelet does not let it go stale.
func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := time.NewTicker(healthResend)
	defer ticker.Stop()
	for {
		gpus, changed := d.snapshot()
		select {
		case <-ctx.Done():
			return nil
		case reports <- healthReport(d.pool, gpus, time.Now()):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}

// healthReport is the kubelet's view of gpus' health at now. Pure.
func healthReport(pool string, gpus []GPU, now time.Time) kubeletplugin.DeviceHealthReport {
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, len(gpus))}
	for i, g := range gpus {
		health, message := kubeletplugin.HealthStatusHealthy, ""
		if !g.Healthy {
			health, message = kubeletplugin.HealthStatusUnhealthy, "marked unhealthy (localcluster gpu unhealthy)"
		}
		report.Devices[i] = kubeletplugin.DeviceHealth{
			PoolName: pool, DeviceName: g.Name(), Health: health, LastUpdated: now, Message: message,
		}
	}
	return report
}
