"""localcluster: a real one-node Kubernetes on this machine, in its own network namespace.

Assembled from real parts (etcd, the Kubernetes control plane, the kubelet,
containerd, runc, CNI bridge, kube-proxy, CoreDNS) so the e2e tests and the
demo exercise what a production cluster would do, with nothing leaving the
machine. Standard library only: it must run before the Python environment
exists. See docs/localcluster.md.
"""
