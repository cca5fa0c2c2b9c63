package main

import (
	"context"
	"fmt"
	"log"
	"reflect"
	"strings"
	"sync"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// envVisibleDevices is what the NVIDIA container toolkit reads to choose the
// GPUs a container sees.
const envVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// plugin serves the kubelet's plugin-registration API (GetInfo, asked by the
// kubelet's plugin watcher) and the device-plugin API on one socket.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer

	resource string
	endpoint string

	mu      sync.Mutex
	devices []Device
	changed chan struct{} // closed and replaced whenever devices change
}

func newPlugin(resource, endpoint string, devices []Device) *plugin {
	return &plugin{resource: resource, endpoint: endpoint, devices: devices, changed: make(chan struct{})}
}

// update replaces the advertised devices; every ListAndWatch stream sends the
// new list. Reports whether anything changed.
func (p *plugin) update(devices []Device) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if reflect.DeepEqual(p.devices, devices) {
		return false
	}
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

func (p *plugin) snapshot() ([]Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices, p.changed
}

// --- plugin registration (the kubelet's plugin watcher) ---

func (p *plugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              p.resource,
		Endpoint:          p.endpoint,
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

func (p *plugin) NotifyRegistrationStatus(_ context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if status.PluginRegistered {
		log.Printf("registered with the kubelet as %s", p.resource)
	} else {
		log.Printf("the kubelet refused the registration: %s", status.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// --- device plugin ---

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	log.Printf("kubelet connected: ListAndWatch")
	for {
		devices, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: toPluginDevices(devices)}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			log.Printf("kubelet disconnected: ListAndWatch ends")
			return nil
		}
	}
}

func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devices, _ := p.snapshot()
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		if unknown := unknownIDs(devices, container.DevicesIds); len(unknown) > 0 {
			return nil, fmt.Errorf("unknown device ids: %s", strings.Join(unknown, ","))
		}
		log.Printf("allocate %s", visibleDevices(container.DevicesIds))
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{envVisibleDevices: visibleDevices(container.DevicesIds)},
		})
	}
	return response, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
