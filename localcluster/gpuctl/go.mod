// The control files localcluster steers its simulated GPUs through, read by
// the device plugin (gpusim) and the DRA driver (gpudra); both require this
// module through a replace directive. No dependencies: it builds offline.
module fusebox.dev/localcluster/gpuctl

go 1.26.0
