"""The protocol machines, sans I/O (DESIGN 2, 3): the ingress and egress, the
Flux producer and consumer (paper section 3), the segment that hosts an
operator partition with its catch-up and checkpoint snapshots, the buffers,
and the host that routes a process's messages to its machines.

Every machine takes messages and the time as arguments and returns what to
send; the runtime (``flux.runtime``) and the simulator (``flux.sim``) drive
them. Nothing here imports ZeroMQ, threads, clocks, files or Spark.
"""
