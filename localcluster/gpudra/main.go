// gpudra is a Dynamic Resource Allocation kubelet plugin for simulated NVIDIA
// GPUs: it publishes the node's GPUs as a ResourceSlice of driver
// gpu.nvidia.com (the name NVIDIA's DRA driver uses), prepares the claims the
// scheduler allocated from it by writing one CDI spec per claim (giving its
// containers NVIDIA_VISIBLE_DEVICES, as the device plugin's Allocate does),
// and streams each GPU's health to the kubelet, which shows it in the pod's
// status. localcluster controls it through files: a GPU count and one file
// per unhealthy GPU, polled.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"fusebox.dev/localcluster/gpuctl"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig to publish ResourceSlices and read claims with")
	nodeName := flag.String("node-name", "", "the node's name: the pool's name and the UUIDs' seed")
	registryDir := flag.String("registry-dir", "", "the kubelet's plugins_registry directory")
	dataDir := flag.String("data-dir", "", "directory for the plugin's socket (inside the kubelet's plugins directory)")
	cdiDir := flag.String("cdi-dir", "", "directory for the CDI spec files of prepared claims")
	control := gpuctl.Flags(flag.CommandLine)
	productName := flag.String("product", "", "the GPUs' product name")
	memoryMiB := flag.Int64("memory-mib", 0, "each GPU's memory in MiB")
	poll := flag.Duration("poll", 500*time.Millisecond, "how often to read the control files")
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *registryDir == "" || *dataDir == "" || *cdiDir == "" ||
		control.CountFile == "" || control.UnhealthyDir == "" || *productName == "" || *memoryMiB <= 0 {
		log.Fatal("--kubeconfig, --node-name, --registry-dir, --data-dir, --cdi-dir, --count-file, " +
			"--unhealthy-dir, --product and --memory-mib are required")
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		log.Fatal(err)
	}
	product := Product{Name: *productName, MemoryMiB: *memoryMiB}
	current, err := readGPUs(*control, *nodeName)
	if err != nil {
		log.Fatal(err)
	}
	d := newDriver(*nodeName, CDIDir(*cdiDir), current)

	// The kubelet makes its plugins directory, not the driver's own below it.
	if err := os.MkdirAll(*dataDir, 0o750); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.PluginDataDirectoryPath(*dataDir),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer helper.Stop()
	publish := func(gpus []GPU) {
		resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			*nodeName: {Slices: []resourceslice.Slice{{Devices: sliceDevices(gpus, product)}}},
		}}
		if err := helper.PublishResources(ctx, resources); err != nil {
			log.Printf("publishing the ResourceSlice: %v", err)
		}
	}
	publish(current)
	log.Printf("serving %d GPUs as %s", len(current), driverName)

	ticker := time.NewTicker(*poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Printf("stopping")
			return
		case <-ticker.C:
			gpus, err := readGPUs(*control, *nodeName)
			if err != nil {
				log.Printf("control files: %v (keeping the last GPUs)", err)
				continue
			}
			if d.update(gpus) {
				log.Printf("GPUs now: %v", gpus)
				publish(gpus)
			}
		}
	}
}
