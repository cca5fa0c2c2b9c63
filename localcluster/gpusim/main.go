// gpusim is a device plugin for simulated NVIDIA GPUs: it advertises
// nvidia.com/gpu devices to the kubelet's device manager, reports each one's
// health, and gives each container the environment NVIDIA's plugin gives
// (NVIDIA_VISIBLE_DEVICES), so scheduling, allocation and health follow the
// path they follow on a GPU node. localcluster controls it through files: a
// GPU count and one file per unhealthy GPU, polled.
package main

import (
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"fusebox.dev/localcluster/gpuctl"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	socket := flag.String("socket", "", "socket to serve on, inside the kubelet's plugins_registry directory")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	seed := flag.String("id-seed", "", "seed of the device ids (the node name): the same seed gives the same ids")
	control := gpuctl.Flags(flag.CommandLine)
	devicesFile := flag.String("devices-file", "", "where to publish the advertised devices as JSON")
	poll := flag.Duration("poll", 500*time.Millisecond, "how often to read the control files")
	flag.Parse()
	if *socket == "" || *seed == "" || control.CountFile == "" || control.UnhealthyDir == "" || *devicesFile == "" {
		log.Fatal("--socket, --id-seed, --count-file, --unhealthy-dir and --devices-file are required")
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	devices, err := readDevices(*control, *seed)
	if err != nil {
		log.Fatal(err)
	}
	if err := writeDevices(*devicesFile, devices); err != nil {
		log.Fatal(err)
	}
	p := newPlugin(*resource, *socket, devices)

	// A socket left by a killed plugin would refuse the listen.
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(*socket), 0o750); err != nil {
		log.Fatal(err)
	}
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, p)
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Fatal(err)
		}
	}()
	log.Printf("serving %d %s on %s", len(devices), *resource, *socket)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	ticker := time.NewTicker(*poll)
	defer ticker.Stop()
	for {
		select {
		case sig := <-stop:
			log.Printf("%s: stopping", sig)
			server.Stop()
			_ = os.Remove(*socket) // the kubelet's plugin watcher deregisters on removal
			return
		case <-ticker.C:
			devices, err := readDevices(*control, *seed)
			if err != nil {
				log.Printf("control files: %v (keeping the last devices)", err)
				continue
			}
			if p.update(devices) {
				log.Printf("devices now: %v", devices)
				if err := writeDevices(*devicesFile, devices); err != nil {
					log.Printf("publishing devices: %v", err)
				}
			}
		}
	}
}
