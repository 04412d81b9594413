"""The Linux machinery of a simulated host (root): its network namespace and the bridge
(`netns`), the packet filter that keeps the bridge to root (`firewall`), detached processes
(`processes`), private files (`private_files`), its directory (`paths`), its PID 1 (`boot`) and
the simulated TPU runtime (`tpu_runtime`). It may read a fake's address (the metadata server's
IP) but never imports the simulation on top."""
