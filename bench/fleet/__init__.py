"""The fleet simulator: fake GPU nodes (kwok) and one process that plays every fake pod.

Pure pieces: `plan` (nodes, address blocks, which pod runs which memory
curve) and `curves` (the memory a pod reports and what an admin action does to
it). I/O pieces: `cluster` (etcd, kube-apiserver, scheduler, controller manager
and kwok on loopback) and `simulator` (the sidecar's /metrics and the admin API
of every fake pod, from one listening socket per port).
"""
