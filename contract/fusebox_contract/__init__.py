"""The one contract between the operator, the server and the sidecar.

Why: a breaker state, a degradation level, a quantization, an action type, an
env name, a port, a metric name or a stats-file field is written by one
process and read by another. Spelled in each, they drift apart silently (the
server refused `awq` that the operator accepted). Here each such name is
declared once, as an enum or a constant, and every side imports it; a
literal of one elsewhere is a bug. Dependency-free: all three distributions
install it, the operator image included.
"""
