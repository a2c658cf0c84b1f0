"""Beyond one machine: MXNet's parameter server (ps-lite ``dist_sync``) or Horovod, never our own
transport. ``backend`` is what a worker does (ranks, reductions, the first-step broadcast, a step
watchdog); ``launch`` starts and watches the scheduler, servers and workers."""
